// Implements one `detaudit run` apart from flag parsing and printing (see session.h).
#include "run/session.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "run/compile_cache.h"
#include "run/recording_watch.h"
#include "run_layout.h"
#include "trace/process_status.h"
#include "trace/run_directory.h"

namespace detaudit::run {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Parses a one-field patch over the config; the error names the flag, then the field.
Status patch(const char* flag, const json& j, Config* config) {
  Status s = parse_config(j, config);
  if (!s.ok()) return Status::error(fmt::format("{}: {}", flag, s.message()), s.code());
  return Status();
}

json range_patch(const std::string& s) {
  if (s == "all") return "all";
  json list = json::array();
  for (const auto& item : split_commas(s)) list.push_back(item);
  return list;
}

// `room`: pad the file with spaces to this many bytes, so that a later rewrite in place finds
// its blocks already allocated (rewrite_json_in_place).
Status write_json_file(const std::string& path, const json& j, size_t room = 0) {
  std::string tmp = path + ".tmp";
  std::string text = j.dump(2) + "\n";
  if (text.size() < room) text.append(room - text.size() - 1, ' ').push_back('\n');
  {
    std::ofstream out(tmp);
    out << text;
    out.close();  // a full disk shows only when the buffer is written
    if (!out) {
      fs::remove(tmp);
      return Status::error(fmt::format("cannot write {}", path), ExitCode::kBadInput);
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);  // whole or absent, never half-written
  if (ec)
    return Status::error(fmt::format("cannot write {}: {}", path, ec.message()),
                         ExitCode::kBadInput);
  return Status();
}

// When the disk is full: over the file's own, already allocated bytes (it was padded), with
// spaces after the JSON. Not atomic, but a full disk leaves no room for the atomic way.
bool rewrite_json_in_place(const std::string& path, const json& j) {
  std::string text = j.dump(2) + "\n";
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec || text.size() > size) return false;
  text.append(size - text.size(), ' ');
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::pwrite(fd, text.data(), text.size(), 0) == ssize_t(text.size());
  ::close(fd);
  return ok;
}

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

}  // namespace

Status apply_run_flags(const RunFlags& f, Config* c) {
  if (f.runs) {
    if (Status s = patch("--runs", {{"runs", *f.runs}}, c); !s.ok()) return s;
  }
  if (f.out)
    if (Status s = patch("--out", {{"out", *f.out}}, c); !s.ok()) return s;
  if (f.steps)
    if (Status s = patch("--steps", {{"select", {{"steps", range_patch(*f.steps)}}}}, c); !s.ok())
      return s;
  if (f.ranks)
    if (Status s = patch("--ranks", {{"select", {{"ranks", range_patch(*f.ranks)}}}}, c); !s.ok())
      return s;
  if (f.ops)
    if (Status s = patch("--ops", {{"select", {{"ops", {{"include", split_commas(*f.ops)}}}}}}, c);
        !s.ok())
      return s;
  if (f.exclude_ops)
    if (Status s = patch("--exclude-ops",
                         {{"select", {{"ops", {{"exclude", split_commas(*f.exclude_ops)}}}}}}, c);
        !s.ok())
      return s;
  if (f.phases) {
    json phases = *f.phases == "all" ? json("all") : json(split_commas(*f.phases));
    if (Status s = patch("--phases", {{"select", {{"phases", phases}}}}, c); !s.ok()) return s;
  }
  if (f.digest)
    if (Status s = patch("--digest", {{"digest", *f.digest}}, c); !s.ok()) return s;
  if (f.no_stats) c->stats = false;
  if (f.allow_truncated) c->gate.allow_truncated = true;
  if (f.rehash_inputs) c->rehash_inputs = true;
  if (f.device_batch_mib)
    if (Status s = patch("--device-batch-mib",
                         {{"record", {{"device_batch_mib", *f.device_batch_mib}}}}, c);
        !s.ok())
      return s;
  if (f.no_mkl_vml_warm_up) c->determinism.mkl_vml_warm_up = false;
  if (f.no_inputs) c->inputs = false;
  if (f.sentinel) c->sentinel = true;
  if (f.seed) c->determinism.seed = *f.seed;
  if (f.deterministic)
    if (Status s = patch("--deterministic", {{"determinism", {{"algorithms", *f.deterministic}}}},
                         c);
        !s.ok())
      return s;
  if (f.threads)
    if (Status s = patch("--threads", {{"determinism", {{"intra_op_threads", *f.threads}}}}, c);
        !s.ok())
      return s;
  if (f.format)
    if (Status s = patch("--format", {{"report", {{"format", *f.format}}}}, c); !s.ok()) return s;
  if (f.output)
    if (Status s = patch("--output", {{"report", {{"output", *f.output}}}}, c); !s.ok()) return s;
  if (f.fail_on)
    if (Status s = patch("--fail-on", {{"gate", {{"fail_on", *f.fail_on}}}}, c); !s.ok()) return s;
  if (f.rtol)
    if (Status s = patch("--rtol", {{"gate", {{"rtol", *f.rtol}}}}, c); !s.ok()) return s;
  if (f.ulp)
    if (Status s = patch("--ulp", {{"gate", {{"ulp", *f.ulp}}}}, c); !s.ok()) return s;
  if (f.atol)
    if (Status s = patch("--atol", {{"gate", {{"atol", *f.atol}}}}, c); !s.ok()) return s;
  for (const auto& kv : f.env) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      return Status::error(fmt::format("--env: expected K=V, got \"{}\"", kv));
    c->target.env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  if (f.cwd) c->target.cwd = *f.cwd;
  if (!f.command.empty()) c->target.command = f.command;
  return Status();
}

Status validate_for_run(const Config& c) {
  if (c.target.command.empty())
    return Status::error(
        "no program to run: give it after \"--\" (detaudit run -- python3 train.py) or as "
        "field \"target.command\" of the config");
  return Status();
}

std::string run_dir_path(const Config& c, int index) {
  return (fs::path(c.out) / fmt::format("run-{}", index)).string();
}

int run_index(const std::string& dir) {
  const std::string base = fs::path(dir).filename().string();
  return base.rfind("run-", 0) == 0 ? std::atoi(base.c_str() + 4) : 0;
}

Status check_run_dir(const std::string& dir, bool force) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return Status();
  if (!fs::is_directory(dir, ec))
    return Status::error(fmt::format("{} exists and is not a directory", dir));
  if (!force && !fs::is_empty(dir, ec))
    return Status::error(fmt::format(
        "{} already holds a run; choose another --out or pass --force to replace it", dir));
  return Status();
}

OutLock::~OutLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays, holding the last pid
}

Status OutLock::acquire(const std::string& out, const std::string& what) {
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec)
    return Status::error(
        fmt::format("cannot create --out {}: {}; choose a directory you can "
                    "write",
                    out, ec.message()));
  const std::string path = (fs::path(out) / ".detaudit.lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    return Status::error(
        fmt::format("cannot write into --out {}: {}; choose a directory you "
                    "can write",
                    out, std::strerror(errno)));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = {};
    (void)!::pread(fd_, pid, sizeof pid - 1, 0);
    std::string holder(pid);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    return Status::error(
        fmt::format("{} is in use by another detaudit{}; wait for it to finish "
                    "or choose another --out",
                    out, holder.empty() ? "" : " (" + holder + ")"));
  }
  // What holds it, for a second one's message; also the proof that a byte can be written here.
  const std::string me = fmt::format("{} pid {}\n", what, ::getpid());
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != ssize_t(me.size()))
    return Status::error(
        fmt::format("cannot write into --out {}: {}; free space there or choose "
                    "another --out",
                    out, std::strerror(errno)));
  return Status();
}

Status prepare_run_dir(const std::string& dir, bool force) {
  if (Status s = check_run_dir(dir, force); !s.ok()) return s;
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_empty(dir, ec)) {
      fs::remove_all(dir, ec);
      if (ec)
        return Status::error(fmt::format("cannot remove {}: {}", dir, ec.message()),
                             ExitCode::kBadInput);
    }
  }
  fs::create_directories(fs::path(dir) / layout::kStreamsDir, ec);
  if (ec)
    return Status::error(fmt::format("cannot create {}: {}", dir, ec.message()),
                         ExitCode::kBadInput);
  return Status();
}

std::vector<std::string> target_environment(const Config& c, const std::string& hooks_library,
                                            const std::string& run_dir_abs,
                                            const std::string& node) {
  std::map<std::string, std::string> vars;
  std::vector<std::string> order;  // keep the parent's order, for a readable environment
  auto set = [&](const std::string& k, const std::string& v) {
    if (!vars.count(k)) order.push_back(k);
    vars[k] = v;
  };
  for (const auto& kv : current_environment()) {
    size_t eq = kv.find('=');
    if (eq != std::string::npos) set(kv.substr(0, eq), kv.substr(eq + 1));
  }
  for (const auto& [k, v] : c.target.env) set(k, v);
  // <lib>/detaudit/torch/<version>/libdetaudit_hooks.so: the shim is <lib>/detaudit's. A library
  // placed by hand, with no shim above it, is preloaded itself (into every child too).
  std::string preload = hooks_library;
  std::error_code ec;
  const fs::path shim = fs::path(hooks_library).parent_path().parent_path().parent_path() /
                        layout::kPreloadLibrary;
  if (!hooks_library.empty() && fs::exists(shim, ec)) {
    preload = shim.string();
    set(layout::kEnvInterposer, hooks_library);
  }
  if (vars.count("LD_PRELOAD") && !vars["LD_PRELOAD"].empty()) preload += ":" + vars["LD_PRELOAD"];
  set("LD_PRELOAD", preload);
  // A Python program imports the interposer's Python side at start (its sitecustomize runs any
  // it shadows): torch.compile's kernels become ops the recorder sees.
  const fs::path python_hooks = fs::path(hooks_library).parent_path().parent_path().parent_path() /
                                layout::kPythonHooksDir;
  if (c.compiled_kernels && !hooks_library.empty() &&
      fs::exists(python_hooks / "sitecustomize.py", ec)) {
    const std::string old = vars.count("PYTHONPATH") ? vars["PYTHONPATH"] : "";
    set("PYTHONPATH", python_hooks.string() + (old.empty() ? "" : ":" + old));
  }
  set(layout::kEnvRunDir, run_dir_abs);
  if (!node.empty()) set(layout::kEnvNode, node);
  // The target is the top of its run: no recorded parent above it (stream_identity.h).
  vars.erase(layout::kEnvParentProcess);
  vars.erase(layout::kEnvParentRank);
  order.erase(std::remove(order.begin(), order.end(), layout::kEnvParentProcess), order.end());
  order.erase(std::remove(order.begin(), order.end(), layout::kEnvParentRank), order.end());
  set(layout::kEnvConfig, layout::config_path(run_dir_abs, node));
  std::vector<std::string> env;
  for (const auto& k : order) env.push_back(k + "=" + vars[k]);
  return env;
}

std::string full_disk_note(const std::string& dir) {
  // What the interposer said of a write the disk refused, if its .status had room for it.
  std::string refused;
  for (const trace::RunFile& f : trace::RunDirectory::list(dir).statuses()) {
    if (!refused.empty()) break;
    trace::ProcessStatus status;
    if (!trace::read_process_status(f.path, &status)) continue;
    for (const std::string& line : status.lines)
      if (line.rfind("trace write failed: ", 0) == 0 || line.rfind("stream not recorded: ", 0) == 0)
        refused = line;
  }
  struct statvfs fs_info {};
  if (::statvfs(dir.c_str(), &fs_info) != 0) return refused;
  const uint64_t free_bytes = uint64_t(fs_info.f_bavail) * fs_info.f_frsize;
  // A write that does not fit fills the disk to its last block before it fails.
  constexpr uint64_t kFull = 64 * 1024;
  if (free_bytes >= kFull && refused.empty()) return "";
  return fmt::format("the disk holding {} is full ({} bytes free){}", dir, free_bytes,
                     refused.empty() ? "" : ": " + refused);
}

std::vector<std::string> list_stream_files(const std::string& run_dir) {
  std::vector<std::string> names;
  for (const trace::RunFile& f : trace::RunDirectory::list(run_dir).traces())
    names.push_back(f.name + layout::kTraceExt);
  return names;
}

std::vector<std::pair<std::string, std::string>> read_stream_statuses(const std::string& run_dir) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const trace::RunFile& f : trace::RunDirectory::list(run_dir).statuses())
    out.emplace_back(f.name, first_line(f.path));
  return out;
}

namespace {

// The processes a node's launcher started: those whose fingerprint names the node.
std::set<std::string> node_processes(const std::string& run_dir, const std::string& node) {
  std::set<std::string> out;
  for (const trace::RunFile& f : trace::RunDirectory::list(run_dir).environments()) {
    std::ifstream in(f.path);
    json j = json::parse(in, nullptr, false);
    if (j.is_object() && j.value("node", json()).is_string() && j["node"] == node)
      out.insert(f.name);
  }
  return out;
}

bool of_processes(const std::string& stream_or_process, const std::set<std::string>& processes) {
  for (const std::string& p : processes)
    if (stream_or_process == p || stream_or_process.rfind(p + ".t-", 0) == 0) return true;
  return false;
}

// Runs the program into `abs_dir` (prepared), with its manifest and config where `node` puts
// them, and finishes the manifest with how it ended.
Status launch_into(const Config& c, const RunOptions& options, const std::string& abs_dir,
                   const std::string& node, int index, RunOutcome* outcome) {
  outcome->dir = abs_dir;
  if (Status s = write_json_file(layout::config_path(abs_dir, node), config_to_json(c)); !s.ok())
    return s;

  std::error_code ec;
  std::string cwd = c.target.cwd.empty() ? fs::current_path(ec).string()
                                         : fs::absolute(c.target.cwd, ec).string();
  json record = {{"detaudit_version", options.version},
                 {"run", index},
                 {"command", c.target.command},
                 {"cwd", cwd},
                 {"env", c.target.env},
                 {"hostname", hostname()},
                 {"hooks_library", options.hooks_library},
                 {"finished", false}};
  if (!node.empty()) record["node"] = node;
  // Written before the launch too, so a run whose supervisor was killed still says what it was.
  std::string manifest = layout::manifest_path(abs_dir, node);
  constexpr size_t kRunJsonRoom = 16384;  // the finished record fits, whatever the disk has left
  if (Status s = write_json_file(manifest, record, kRunJsonRoom); !s.ok()) return s;

  LaunchSpec spec;
  spec.argv = c.target.command;
  spec.env = target_environment(c, options.hooks_library, abs_dir, node);
  for (const std::string& failure :
       give_run_its_compile_caches(&spec.env, layout::compile_cache_path(abs_dir, node)))
    fmt::print(stderr, "detaudit: warning: {}\n", failure);
  spec.cwd = c.target.cwd;
  spec.log_path = node.empty() ? (fs::path(abs_dir) / layout::kOutputLog).string()
                               : (fs::path(abs_dir) / layout::kNodesDir / (node + ".log")).string();
  spec.echo = options.echo;
  // The cost of a full recording is said for a launcher's first run: each is alike.
  static std::atomic<bool> cost_said{false};
  RecordingWatch watch(c, abs_dir, index, !cost_said.exchange(true));
  spec.on_tick = [&watch] { watch.tick(); };
  if (Status s = launch_and_wait(spec, &outcome->result); !s.ok()) return s;

  const LaunchResult& r = outcome->result;
  outcome->streams = list_stream_files(abs_dir);
  outcome->statuses = read_stream_statuses(abs_dir);
  if (!node.empty()) {
    // The directory is shared: this launcher answers for its own processes only.
    const std::set<std::string> mine = node_processes(abs_dir, node);
    auto& streams = outcome->streams;
    streams.erase(std::remove_if(streams.begin(), streams.end(),
                                 [&](const std::string& f) {
                                   return !of_processes(fs::path(f).stem().string(), mine);
                                 }),
                  streams.end());
    auto& statuses = outcome->statuses;
    statuses.erase(std::remove_if(statuses.begin(), statuses.end(),
                                  [&](const auto& st) { return !mine.count(st.first); }),
                   statuses.end());
  }
  for (const auto& [process, _] : outcome->statuses) {
    trace::ProcessStatus status;
    if (!trace::read_process_status(
            (fs::path(abs_dir) / layout::kStreamsDir / (process + layout::kStatusExt)).string(),
            &status))
      continue;
    if (!status.ending) {
      outcome->endings.emplace_back(process, "");
    } else if (!status.ending->clean()) {
      outcome->endings.emplace_back(process, status.ending->describe());
    }
  }
  record["finished"] = true;
  record["start_time"] = r.start_time;
  record["duration_s"] = r.duration_s;
  record["exit_code"] = r.signal ? json(nullptr) : json(r.exit_code);
  record["signal"] = r.signal ? json(signal_name(r.signal)) : json(nullptr);
  record["succeeded"] = r.succeeded();
  record["streams"] = outcome->streams;
  json statuses = json::object();
  for (const auto& [process, status] : outcome->statuses) statuses[process] = status;
  record["statuses"] = statuses;
  Status s = write_json_file(manifest, record);
  if (!s.ok() && rewrite_json_in_place(manifest, record)) return Status();
  return s;
}

}  // namespace

Status execute_run(const Config& c, const RunOptions& options, int index, RunOutcome* outcome) {
  *outcome = RunOutcome{};
  std::string dir = run_dir_path(c, index);
  if (Status s = prepare_run_dir(dir, options.force); !s.ok()) return s;
  return launch_into(c, options, fs::absolute(dir).lexically_normal().string(), "", index, outcome);
}

std::string default_node_name() {
  std::string name = hostname();
  if (name.empty()) name = "node";
  if (const char* task = std::getenv("SLURM_PROCID"); task && *task)
    name += ".task" + std::string(task);
  return name;
}

Status execute_node_run(const Config& c, const RunOptions& options, const std::string& run_dir,
                        const std::string& node, RunOutcome* outcome) {
  *outcome = RunOutcome{};
  if (node.empty() || node.find('/') != std::string::npos || node[0] == '.')
    return Status::error(
        fmt::format("--node \"{}\": a node name is one path component, not "
                    "starting with '.'; choose another",
                    node));
  const std::string abs_dir = fs::absolute(run_dir).lexically_normal().string();
  std::error_code ec;
  if (fs::exists(fs::path(abs_dir) / layout::kRunJson, ec))
    return Status::error(fmt::format(
        "{} holds a run of `detaudit run` (run.json); record into a new directory", run_dir));
  fs::create_directories(fs::path(abs_dir) / layout::kStreamsDir, ec);
  if (!ec) fs::create_directories(fs::path(abs_dir) / layout::kNodesDir, ec);
  if (ec)
    return Status::error(fmt::format("cannot create {}: {}; choose a directory you can write",
                                     run_dir, ec.message()),
                         ExitCode::kBadInput);
  // Claimed at once, before anything runs: two launchers never share a manifest.
  const std::string manifest = layout::manifest_path(abs_dir, node);
  int fd = ::open(manifest.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0 && errno == EEXIST)
    return Status::error(fmt::format(
        "{} already holds node {}'s part of a run ({}); give each launcher its own --node, or "
        "record into a new directory",
        run_dir, node, manifest));
  if (fd < 0)
    return Status::error(fmt::format("cannot write {}: {}; choose a directory you can write",
                                     manifest, std::strerror(errno)),
                         ExitCode::kBadInput);
  ::close(fd);
  return launch_into(c, options, abs_dir, node, run_index(abs_dir), outcome);
}

}  // namespace detaudit::run
