#include "cli/capture_run.h"

#include <fmt/format.h>

#include <fstream>

#include "run/launcher.h"
#include "run_layout.h"
#include "trace/run_directory.h"

namespace detaudit::cli {
namespace fs = std::filesystem;
using nlohmann::json;

Status find_recorded_run(const std::string& run_arg, CaptureRun* c) {
  c->root = run_arg;
  std::error_code ec;
  c->audit = fs::exists(c->root / "run-0" / layout::kRunJson, ec);
  c->run = c->audit ? (c->root / "run-0").string() : c->root.string();
  trace::RunDirectory run;
  if (Status s = trace::RunDirectory::open(c->run, &run); !s.ok()) return s;
  // Replay and coverage run the recorded command again: `detaudit run` wrote it down.
  if (!fs::exists(run.run_manifest(), ec))
    return Status::error(
        fmt::format("{}: recorded without `detaudit run` (no {}), so its command is not known; "
                    "give `detaudit run --out`'s directory or one of its run-<i>",
                    run_arg, layout::kRunJson),
        ExitCode::kBadInput);
  return Status();
}

Status prepare_capture_run(const std::string& out_flag, const std::string& default_subdir,
                           bool force, const std::string& verb, bool take_lock, CaptureRun* c) {
  const fs::path run_json_path = fs::path(c->run) / layout::kRunJson;
  std::ifstream in(run_json_path);
  const json run_json = json::parse(in, nullptr, false);
  if (!run_json.is_object())
    return Status::error(fmt::format("{}: not JSON", run_json_path.string()), ExitCode::kBadInput);
  if (Status s = load_config((fs::path(c->run) / layout::kConfigJson).string(), &c->config);
      !s.ok())
    return s;
  const std::string out = out_flag.empty() ? (c->root / default_subdir).string() : out_flag;
  // The audit it reads and writes beside is ours alone meanwhile (a `detaudit run --force` into
  // it would replace the run being replayed).
  if (take_lock)
    if (Status s = c->lock.acquire(
            c->audit ? c->root.string() : fs::absolute(out).parent_path().string(), verb);
        !s.ok())
      return s;
  if (Status s = run::check_run_dir(out, force); !s.ok()) return s;
  if (Status s = run::prepare_run_dir(out, force); !s.ok()) return s;
  c->out = fs::absolute(out).lexically_normal().string();
  c->capture_dir = c->out + "/capture";
  std::error_code ec;
  fs::create_directories(c->capture_dir, ec);
  c->spec_path = c->out + "/capture-spec.json";
  // The recorded command again, as recorded, with the capture asked of the interposer.
  c->config.out = c->out;
  c->config.runs = 1;
  if (run_json.contains("cwd")) c->config.target.cwd = run_json["cwd"].get<std::string>();
  c->options.hooks_library = run_json.value("hooks_library", "");
  c->options.version = DETAUDIT_VERSION;
  c->options.force = true;
  c->options.echo = false;
  c->replayer = (fs::path(c->options.hooks_library).parent_path() / "detaudit_replay").string();
  for (const std::string& kv : run::current_environment())
    if (kv.rfind("LD_PRELOAD=", 0) != 0) c->replayer_env.push_back(kv);
  for (const auto& [k, v] : c->config.target.env) c->replayer_env.push_back(k + "=" + v);
  return Status();
}

void set_capture_spec(const json& spec, CaptureRun* c) {
  std::ofstream(c->spec_path) << spec.dump(1) << "\n";
  c->config.target.env["DETAUDIT_CAPTURE"] = c->spec_path;
}

}  // namespace detaudit::cli
