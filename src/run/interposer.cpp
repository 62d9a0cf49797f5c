#include "run/interposer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "run/launcher.h"
#include "run/session.h"

namespace detaudit::run {
namespace {

namespace fs = std::filesystem;

constexpr const char* kLibraryName = "libdetaudit_hooks.so";
constexpr const char* kDescriptionName = "torch.txt";

// Prints the torch a Python imports: version, C++ ABI, and the libtorch_cpu it mapped.
constexpr const char* kPythonProbe =
    "import torch\n"
    "print(torch.__version__)\n"
    "print(int(torch._C._GLIBCXX_USE_CXX11_ABI))\n"
    "print(next((l.split()[-1] for l in open('/proc/self/maps') if '/libtorch_cpu' in l), ''))\n";

// Where a Python would import torch from, without importing it (a Python start, about 30 ms
// against the 1-1.5 s of `import torch`): the interpreter, the package's folder, and the files
// whose change means another torch. The full probe's answer for the same lines is reused.
constexpr const char* kPythonLocate =
    "import glob, importlib.util, os, sys\n"
    "s = importlib.util.find_spec('torch')\n"
    "d = os.path.dirname(s.origin) if s and s.origin else ''\n"
    "print(os.path.realpath(sys.executable))\n"
    "print(d)\n"
    "for p in [os.path.join(d, 'version.py'), os.path.join(d, 'lib', 'libtorch_cpu.so')] + "
    "sorted(glob.glob(os.path.join(d, '_C*.so'))):\n"
    "    try:\n"
    "        st = os.stat(p)\n"
    "        print(p, st.st_ino, st.st_size, st.st_mtime_ns)\n"
    "    except OSError:\n"
    "        print(p, '-')\n";

std::string real_path(const std::string& p) {
  std::error_code ec;
  fs::path r = fs::canonical(p, ec);
  return ec ? p : r.string();
}

// The program's environment without the interposer: probes must not record anything.
std::vector<std::string> probe_environment(const Config& c) {
  std::vector<std::string> env;
  for (const auto& kv : target_environment(c, "", "/nonexistent"))
    if (kv.rfind("LD_PRELOAD=", 0) != 0 && kv.rfind("DETAUDIT_", 0) != 0) env.push_back(kv);
  return env;
}

std::string env_value(const std::vector<std::string>& env, const std::string& key) {
  for (const auto& kv : env)
    if (kv.size() > key.size() && kv.compare(0, key.size(), key) == 0 && kv[key.size()] == '=')
      return kv.substr(key.size() + 1);
  return "";
}

// `name` as the program's PATH finds it; a name with a '/' is taken as it is.
std::string find_program(const std::string& name, const std::vector<std::string>& env) {
  if (name.find('/') != std::string::npos) return name;
  std::istringstream dirs(env_value(env, "PATH"));
  for (std::string dir; std::getline(dirs, dir, ':');) {
    fs::path p = fs::path(dir.empty() ? "." : dir) / name;
    if (::access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "";
}

bool is_python_name(const std::string& path) {
  return fs::path(path).filename().string().rfind("python", 0) == 0;
}

// The interpreter of a "#!" script when it is a Python ("#!/usr/bin/env python3" included).
std::string script_python(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string line;
  if (!in || !std::getline(in, line) || line.rfind("#!", 0) != 0) return "";
  std::istringstream words(line.substr(2));
  std::vector<std::string> argv;
  for (std::string w; words >> w;) argv.push_back(w);
  if (argv.size() >= 2 && fs::path(argv[0]).filename() == "env") argv.erase(argv.begin());
  return !argv.empty() && is_python_name(argv[0]) ? argv[0] : "";
}

// The Python a program is, or the one its "#!" names; empty for anything else.
std::string python_of(const std::string& program) {
  if (program.empty()) return "";
  return is_python_name(program) ? program : script_python(program);
}

// The folder for what `detaudit run` remembers between invocations; empty when there is none.
std::string cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (xdg && *xdg) return std::string(xdg) + "/detaudit";
  if (home && *home) return std::string(home) + "/.cache/detaudit";
  return "";
}

// What kPythonLocate printed, with the library path that picks the libtorch_cpu loaded: the key
// of a probe's answer. Empty when it does not show a torch package (no torch, or not a Python).
std::string probe_key(const std::string& python, const Config& c,
                      const std::vector<std::string>& env) {
  std::string out;
  int exit_code = 0;
  if (!capture_output({python, "-c", kPythonLocate}, env, c.target.cwd, &out, &exit_code).ok() ||
      exit_code != 0)
    return "";
  std::istringstream lines(out);
  std::string executable, dir;
  std::getline(lines, executable);
  std::getline(lines, dir);
  std::error_code ec;
  if (dir.empty() || !fs::is_regular_file(fs::path(dir) / "version.py", ec)) return "";
  return fmt::format("{}\nLD_LIBRARY_PATH={}\ncwd={}\n{}", python,
                     env_value(env, "LD_LIBRARY_PATH"), c.target.cwd, out);
}

// The full probe's output, remembered under its key in the cache folder (a line with the key's
// length, the key, then the output). A write that fails leaves nothing to remember.
std::string cache_file(const std::string& key) {
  const std::string dir = cache_dir();
  if (dir.empty() || key.empty()) return "";
  return fmt::format("{}/torch-probe-{:016x}", dir, std::hash<std::string>{}(key));
}

bool cached_probe(const std::string& key, std::string* out) {
  const std::string path = cache_file(key);
  std::ifstream in(path, std::ios::binary);
  if (path.empty() || !in) return false;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string head = std::to_string(key.size()) + "\n";
  if (text.compare(0, head.size(), head) != 0 || text.compare(head.size(), key.size(), key) != 0)
    return false;
  *out = text.substr(head.size() + key.size());
  return !out->empty();
}

void remember_probe(const std::string& key, const std::string& out) {
  const std::string path = cache_file(key);
  if (path.empty()) return;
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  const std::string tmp = fmt::format("{}.{}", path, ::getpid());
  {
    std::ofstream f(tmp, std::ios::binary);
    f << key.size() << "\n" << key << out;
    if (!f) return;
  }
  fs::rename(tmp, path, ec);  // whole or not at all, even beside another detaudit
  if (ec) fs::remove(tmp, ec);
}

bool probe_python(const std::string& python, const Config& c, const std::vector<std::string>& env,
                  ProgramTorch* torch) {
  std::string out;
  int exit_code = 0;
  const std::string key = probe_key(python, c, env);
  if (!cached_probe(key, &out)) {
    if (!capture_output({python, "-c", kPythonProbe}, env, c.target.cwd, &out, &exit_code).ok() ||
        exit_code != 0)
      return false;
    if (!key.empty()) remember_probe(key, out);
  }
  std::istringstream lines(out);
  std::string abi;
  std::getline(lines, torch->version);
  std::getline(lines, abi);
  std::getline(lines, torch->libtorch_cpu);
  if (torch->version.empty()) return false;
  torch->cxx11_abi = abi == "1" ? 1 : abi == "0" ? 0 : -1;
  if (!torch->libtorch_cpu.empty()) torch->libtorch_cpu = real_path(torch->libtorch_cpu);
  torch->python = python;
  torch->described = fmt::format("{} imports torch {} ({})", python, torch->version,
                                 torch->libtorch_cpu.empty() ? "?" : torch->libtorch_cpu);
  return true;
}

// The libtorch_cpu a dynamically linked program loads, by ldd in the program's environment.
bool probe_linked(const std::string& program, const Config& c, const std::vector<std::string>& env,
                  ProgramTorch* torch) {
  std::string out;
  int exit_code = 0;
  if (!capture_output({"ldd", program}, env, c.target.cwd, &out, &exit_code).ok() || exit_code != 0)
    return false;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    size_t name = line.find("libtorch_cpu.so");
    size_t arrow = line.find("=> /");
    if (name == std::string::npos || arrow == std::string::npos) continue;
    std::string path = line.substr(arrow + 3);
    path = path.substr(0, path.find(" ("));
    torch->libtorch_cpu = real_path(path);
    torch->described = fmt::format("{} links {}", program, torch->libtorch_cpu);
    return true;
  }
  return false;
}

std::string versions_of(const std::vector<InterposerBuild>& builds) {
  std::string s;
  for (const auto& b : builds) s += (s.empty() ? "" : ", ") + b.version;
  return s;
}

}  // namespace

Status read_interposer_build(const std::string& dir, InterposerBuild* build) {
  const std::string description = (fs::path(dir) / kDescriptionName).string();
  std::ifstream in(description);
  if (!in) return Status::error(fmt::format("cannot read {}", description));
  std::map<std::string, std::string> fields;
  for (std::string line; std::getline(in, line);) {
    size_t eq = line.find('=');
    if (eq != std::string::npos) fields[line.substr(0, eq)] = line.substr(eq + 1);
  }
  *build = InterposerBuild{};
  build->library = (fs::path(dir) / kLibraryName).string();
  build->version = fields["version"];
  build->cxx11_abi = fields["cxx11_abi"] != "0";
  build->libtorch_cpu = fields["libtorch_cpu"];
  build->python = fields["python"];
  build->device_digest = fields["device_digest"] == "ON";
  if (build->version.empty())
    return Status::error(fmt::format("{}: no version= line; rebuild the interposer", description));
  if (!fs::exists(build->library))
    return Status::error(
        fmt::format("{} has no {} beside it: its build did not finish", description, kLibraryName));
  return Status();
}

trace::DigestAlgo default_digest(const Config& config, const InterposerBuild& build,
                                 const std::string& dev_dir) {
  if (!build.device_digest) return trace::DigestAlgo::kMd5;
  const char* ours = std::getenv("CUDA_VISIBLE_DEVICES");
  std::optional<std::string> visible = ours ? std::optional<std::string>(ours) : std::nullopt;
  if (auto it = config.target.env.find("CUDA_VISIBLE_DEVICES"); it != config.target.env.end())
    visible = it->second;
  if (visible && (visible->empty() || visible->rfind("-1", 0) == 0)) return trace::DigestAlgo::kMd5;
  std::error_code ec;
  for (fs::directory_iterator it(dev_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > 6 && name.rfind("nvidia", 0) == 0 &&
        std::all_of(name.begin() + 6, name.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      return trace::DigestAlgo::kDevice;
  }
  return trace::DigestAlgo::kMd5;
}

std::vector<InterposerBuild> list_interposers(const std::string& lib_dir) {
  std::vector<InterposerBuild> builds;
  std::error_code ec;
  for (fs::directory_iterator it(fs::path(lib_dir) / "torch", ec), end; !ec && it != end;
       it.increment(ec)) {
    InterposerBuild b;
    if (it->is_directory() && read_interposer_build(it->path().string(), &b).ok())
      builds.push_back(std::move(b));
  }
  std::sort(builds.begin(), builds.end(),
            [](const auto& a, const auto& b) { return a.version < b.version; });
  return builds;
}

// `sh -c SCRIPT` (bash, dash, zsh alike): the first word of SCRIPT that is a Python, or a script
// a Python runs (torchrun), as the program's PATH finds it.
std::string shell_script_python(const std::vector<std::string>& command,
                                const std::vector<std::string>& env) {
  static const char* kShells[] = {"sh", "bash", "dash", "zsh"};
  const std::string shell = fs::path(command[0]).filename().string();
  if (std::find(std::begin(kShells), std::end(kShells), shell) == std::end(kShells)) return "";
  auto c = std::find(command.begin() + 1, command.end(), "-c");
  if (c == command.end() || c + 1 == command.end()) return "";
  std::string script = *(c + 1);
  for (char& ch : script)
    if (std::strchr(";&|()'\"`<>\n\t", ch)) ch = ' ';
  std::istringstream words(script);
  for (std::string w; words >> w;) {
    if (w.find('=') != std::string::npos || w[0] == '$' || w[0] == '-') continue;
    if (std::string python = python_of(find_program(w, env)); !python.empty()) return python;
  }
  return "";
}

// A launcher's command (env, timeout, taskset, numactl, nice, mpirun, ...): the first later word
// that is a Python, a Python's script or a program linked to libtorch. NAME=VALUE words (env's)
// set the environment the rest is probed in: its PATH finds the Python.
bool probe_launched(const Config& c, std::vector<std::string> env, ProgramTorch* torch) {
  const std::vector<std::string>& command = c.target.command;
  constexpr size_t kWordsLooked = 12;  // a launcher's own options come first, and are few
  for (size_t i = 1; i < command.size() && i <= kWordsLooked; ++i) {
    const std::string& word = command[i];
    if (word.empty() || word[0] == '-') continue;
    if (size_t eq = word.find('='); eq != std::string::npos) {
      const std::string key = word.substr(0, eq + 1);
      env.erase(std::remove_if(env.begin(), env.end(),
                               [&key](const std::string& kv) { return kv.rfind(key, 0) == 0; }),
                env.end());
      env.push_back(word);
      continue;
    }
    const std::string found = find_program(word, env);
    if (found.empty() || fs::is_directory(found)) continue;
    if (std::string python = python_of(found); !python.empty())
      return probe_python(python, c, env, torch);
    if (probe_linked(found, c, env, torch)) return true;
  }
  return false;
}

ProgramTorch probe_program_torch(const Config& c) {
  ProgramTorch torch;
  if (c.target.command.empty()) return torch;
  const std::vector<std::string> env = probe_environment(c);
  const std::string& argv0 = c.target.command[0];
  if (is_python_name(argv0)) {
    probe_python(argv0, c, env, &torch);
    return torch;  // a Python without torch: nothing else would tell
  }
  const std::string program = find_program(argv0, env);
  if (!program.empty()) {
    if (std::string python = script_python(program); !python.empty()) {
      if (probe_python(python, c, env, &torch)) return torch;  // torchrun and other entry points
    } else if (probe_linked(program, c, env, &torch)) {
      return torch;
    }
  }
  if (std::string python = shell_script_python(c.target.command, env); !python.empty())
    if (probe_python(python, c, env, &torch)) return torch;
  if (probe_launched(c, env, &torch)) return torch;
  // A shell script: most likely it runs the Python on its PATH.
  probe_python("python3", c, env, &torch);
  return torch;
}

const InterposerBuild* match_interposer(const std::vector<InterposerBuild>& builds,
                                        const ProgramTorch& torch) {
  if (!torch.libtorch_cpu.empty())
    for (const auto& b : builds)
      if (b.libtorch_cpu == torch.libtorch_cpu) return &b;
  // The same wheel in another virtual environment is the same build.
  if (!torch.version.empty())
    for (const auto& b : builds)
      if (b.version == torch.version &&
          (torch.cxx11_abi < 0 || b.cxx11_abi == (torch.cxx11_abi == 1)))
        return &b;
  return nullptr;
}

std::string build_command_for(const ProgramTorch& torch, const std::string& source_dir,
                              const std::string& lib_dir) {
  std::string which = torch.python;
  if (which.empty()) {
    // <prefix>/lib/libtorch_cpu.so: the prefix holds its CMake config; /usr is the system's.
    fs::path prefix = fs::path(torch.libtorch_cpu).parent_path().parent_path();
    which = prefix.string().rfind("/usr", 0) == 0 && prefix.string().rfind("/usr/local", 0) != 0
                ? "system"
                : prefix.string();
  }
  // A pip-installed detaudit (lib_dir inside the package) is advised pip's route: install
  // detaudit into the program's own environment, built for its torch.
  const fs::path package = fs::path(lib_dir).parent_path().parent_path();
  std::error_code ec;
  if (!torch.python.empty() && fs::exists(package / "__init__.py", ec))
    return fmt::format(
        "{} -m pip install --no-build-isolation {} (detaudit in that environment, "
        "built for its torch)",
        torch.python, source_dir);
  std::string name = torch.version.empty() ? "program" : torch.version;
  std::replace_if(
      name.begin(), name.end(), [](char ch) { return !std::isalnum(ch) && ch != '.'; }, '_');
  fs::path build = fs::path(lib_dir).parent_path().parent_path() / "torch" / ("extra-" + name);
  return fmt::format(
      "cmake -S {}/hooks -B {} -DDETAUDIT_TORCH={} -DDETAUDIT_INTERPOSER_DIR={} && "
      "cmake --build {}",
      source_dir, build.string(), which, lib_dir, build.string());
}

Status choose_interposer(const Config& c, const std::string& explicit_library,
                         const std::string& lib_dir, const std::string& source_dir,
                         std::string* library) {
  std::vector<InterposerBuild> builds;
  if (!explicit_library.empty()) {
    *library = explicit_library;
    InterposerBuild b;
    // A hand-placed library with no torch.txt beside it: the user vouches for it.
    if (!read_interposer_build(fs::path(explicit_library).parent_path().string(), &b).ok())
      return Status();
    builds.push_back(b);
  } else {
    builds = list_interposers(lib_dir);
    if (builds.empty())
      return Status::error(
          fmt::format("no interposer is built in {}/torch; build one for your torch: cmake -S {} "
                      "-B build -DDETAUDIT_TORCH=/path/to/python && cmake --build build",
                      lib_dir, source_dir),
          ExitCode::kUsage);
  }
  const ProgramTorch torch = probe_program_torch(c);
  if (!torch.known()) {
    // No torch to be seen (a Python without it, a static or foreign program): with one build,
    // the program will say so itself, or record nothing, which `run` reports. With several, a
    // guess can preload one libtorch into a program that loads another: it crashes.
    if (!explicit_library.empty()) return Status();
    if (builds.size() == 1) {
      *library = builds.front().library;
      return Status();
    }
    return Status::error(
        fmt::format("cannot tell which torch `{}` loads (no Python, Python script or program "
                    "linked to libtorch in the command, and python3 on its PATH has no torch), "
                    "and interposers are built for torch {}: put the Python first (detaudit run "
                    "-- /path/to/python train.py) or name one with DETAUDIT_HOOKS={}",
                    c.target.command[0], versions_of(builds), builds.front().library),
        ExitCode::kUsage);
  }
  if (const InterposerBuild* b = match_interposer(builds, torch)) {
    *library = b->library;
    return Status();
  }
  return Status::error(
      fmt::format("{}, but the interposer is built only for torch {}; build one for it: {}",
                  torch.described, versions_of(builds),
                  build_command_for(torch, source_dir, lib_dir)),
      ExitCode::kUsage);
}

}  // namespace detaudit::run
