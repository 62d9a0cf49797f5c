// Loading, flattening and comparing environment fingerprints.
#include "diff/environment.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>

#include "trace/run_directory.h"

namespace detaudit {
namespace fs = std::filesystem;

void flatten_json(const nlohmann::json& j, const std::string& prefix,
                  std::map<std::string, std::string>* out) {
  if (j.is_object() && !j.empty()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      flatten_json(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
    return;
  }
  (*out)[prefix] = j.is_string() ? j.get<std::string>() : j.dump();
}

bool volatile_env_key(const std::string& key) {
  std::string last = key.substr(key.rfind('.') + 1);
  static const char* kVolatile[] = {
      "pid",      "ppid",       "time",    "unix_ns", "start_time",       "end_time",
      "duration", "duration_s", "elapsed", "wall_s",  "DETAUDIT_RUN_DIR", "DETAUDIT_CONFIG",
      "run_dir"};
  for (const char* v : kVolatile)
    if (last == v) return true;
  return last.find("time") != std::string::npos && last.find("threads") == std::string::npos;
}

Status load_environment(const trace::RunDirectory& run,
                        std::map<std::string, std::map<std::string, std::string>>* out) {
  for (const trace::RunFile& f : run.environments()) {
    std::ifstream in(f.path);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return Status::error(fmt::format("{}: offset 0: not a JSON object (corrupt environment "
                                       "fingerprint)",
                                       f.path),
                           ExitCode::kBadInput);
    auto& flat = (*out)[f.name];
    flatten_json(j, "", &flat);
    if (auto it = flat.find("build_config"); it != flat.end()) {
      const std::string text = it->second;
      flat.erase(it);
      split_build_config(text, &flat);
    }
  }
  // run.json: only the outcome is comparable; the rest is paths and times.
  std::ifstream rin(run.run_manifest());
  if (rin) {
    nlohmann::json j = nlohmann::json::parse(rin, nullptr, false);
    if (j.is_object())
      for (const char* k : {"exit_code", "signal"})
        if (j.contains(k))
          (*out)["run"][k] = j.at(k).is_string() ? j.at(k).get<std::string>() : j.at(k).dump();
  }
  return Status();
}

namespace {

bool has_digit(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) { return std::isdigit(uint8_t(c)); });
}

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && std::isspace(uint8_t(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(uint8_t(s.back()))) s.remove_suffix(1);
  return s;
}

// "Build settings: BLAS_INFO=mkl, CXX_FLAGS= -O2 -fPIC, USE_CUDA=0, ": a setting starts after
// ", " at an upper-case name and "=" (flags hold commas without the space).
void split_build_settings(std::string_view s, std::map<std::string, std::string>* out) {
  auto starts_setting = [&](size_t at) {
    size_t i = at;
    while (i < s.size() &&
           (std::isupper(uint8_t(s[i])) || std::isdigit(uint8_t(s[i])) || s[i] == '_'))
      ++i;
    return i > at && i < s.size() && s[i] == '=';
  };
  size_t begin = 0;
  while (begin < s.size()) {
    size_t end = begin;
    for (;;) {
      end = s.find(", ", end);
      if (end == std::string_view::npos || starts_setting(end + 2)) break;
      end += 2;
    }
    std::string_view setting = trimmed(s.substr(begin, end == s.npos ? s.npos : end - begin));
    if (!setting.empty() && setting.back() == ',') setting.remove_suffix(1);  // the list's last
    if (size_t eq = setting.find('='); eq != std::string_view::npos && eq > 0)
      (*out)[fmt::format("build_config.{}", setting.substr(0, eq))] = std::string(
          trimmed(setting.substr(eq + 1)));
    if (end == std::string_view::npos) break;
    begin = end + 2;
  }
}

}  // namespace

void split_build_config(const std::string& text, std::map<std::string, std::string>* out) {
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string_view line = trimmed(std::string_view(text).substr(begin, end - begin));
    begin = end + 1;
    if (line.rfind("- ", 0) == 0) line = trimmed(line.substr(2));
    if (line.empty() || line.rfind("PyTorch built with", 0) == 0) continue;
    constexpr std::string_view kSettings = "Build settings:";
    if (line.rfind(kSettings, 0) == 0) {
      split_build_settings(trimmed(line.substr(kSettings.size())), out);
      continue;
    }
    // "Intel(R) MKL-DNN v3.12.0 (Git Hash ...)": the words before the first with a digit name
    // the component, the rest is its version; a line without one is a feature the build has.
    size_t at = 0, value_at = std::string_view::npos;
    while (at < line.size()) {
      size_t word_end = line.find(' ', at);
      if (word_end == std::string_view::npos) word_end = line.size();
      if (has_digit(line.substr(at, word_end - at))) {
        value_at = at;
        break;
      }
      at = word_end + 1;
    }
    std::string_view name = value_at == std::string_view::npos || value_at == 0
                                ? line
                                : trimmed(line.substr(0, value_at));
    if (!name.empty() && name.back() == ':') name.remove_suffix(1);
    (*out)[fmt::format("build_config.{}", name)] = value_at == std::string_view::npos ||
                                                           value_at == 0
                                                       ? "yes"
                                                       : std::string(line.substr(value_at));
  }
}

namespace {

// A character a path's name may hold: a run named "A" is not in "oneAPI".
bool in_name(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' ||
         c == '~' || c == '+';
}

// The run's directory in a fingerprint value -> "<run>": its absolute path anywhere, its path as
// given where it is a path.
std::string normalise(std::string v, const std::string& run_dir) {
  if (run_dir.empty()) return v;
  std::string abs = fs::absolute(run_dir).lexically_normal().string();
  while (!abs.empty() && abs.back() == '/') abs.pop_back();
  std::string rel = run_dir;
  while (rel.size() > 1 && rel.back() == '/') rel.pop_back();
  for (const std::string& p : {abs, rel}) {
    if (p.empty()) continue;
    for (size_t at = 0; (at = v.find(p, at)) != std::string::npos;) {
      const size_t end = at + p.size();
      const char before = at == 0 ? '\0' : v[at - 1], after = end == v.size() ? '\0' : v[end];
      // A relative name is a path's head ("A/ck") or a whole value or string ("A"): "Type A"
      // is no path.
      const bool whole = p == abs ? !in_name(after)
                                  : !in_name(before) && before != '/' &&
                                        (after == '/' ||
                                         (before == after && (before == '"' || before == '\0')));
      if (!whole) {
        ++at;
        continue;
      }
      v.replace(at, p.size(), "<run>");
      at += 5;
    }
  }
  return v;
}

// The words of `flags` that `other` lacks, in their order; "(none)" when there are none, and
// their count when `other` is absent.
std::string flags_only_in(const std::string& flags, const std::string& other) {
  auto words = [](const std::string& text) {
    std::vector<std::string> w;
    std::istringstream in(text);
    for (std::string word; in >> word;) w.push_back(word);
    return w;
  };
  if (flags == "(absent)") return flags;
  if (other == "(absent)") return fmt::format("{} flags", words(flags).size());
  const std::vector<std::string> theirs = words(other);
  std::string only;
  for (const std::string& w : words(flags))
    if (std::find(theirs.begin(), theirs.end(), w) == theirs.end())
      only += (only.empty() ? "" : " ") + w;
  return only.empty() ? "(none)" : only;
}

}  // namespace

int suspect_rank(const std::string& key) {
  auto starts = [&](std::string_view prefix) { return key.rfind(prefix, 0) == 0; };
  auto ends = [&](std::string_view suffix) {
    return key.size() >= suffix.size() &&
           key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  // The build first: a version that differs explains any difference of numerics. Then the
  // libraries that compute (BLAS, oneMKL, oneDNN, CUDA, cuDNN, NCCL) and the CPU's kernels.
  if (key == "torch_version") return 0;
  if (key == "build_config.COMMIT_SHA") return 1;
  const bool build = starts("build_config.");
  if (key == "mkl" || (build && !ends("_FLAGS (flags only in each)") && !ends("_FLAGS") && [&] {
        for (const char* library : {"BLAS", "LAPACK", "MKL", "CUDA_VERSION", "CUDNN", "CuDNN",
                                    "CUDA Runtime", "NCCL", "CPU capability", "OpenMP", "Magma"})
          if (key.find(library) != std::string::npos) return true;
        return false;
      }()))
    return 2;
  if (starts("cuda.")) return 3;  // the GPU, its driver and the CUDA libraries it loaded
  if (build && !ends("_FLAGS") && !ends("(flags only in each)") && !ends("COMPILER") &&
      !ends("GCC") && !ends("C++ Version") && !ends("BUILD_TYPE"))
    return 4;                     // what else the build has (USE_CUDA, NNPACK)
  if (starts("cuda.")) return 2;  // the GPU, its driver and the CUDA libraries it loaded
  if (key.find("threads") != std::string::npos) return 5;
  if (starts("determinism.")) return 6;
  if (key.find("SEED") != std::string::npos || key.find("seed") != std::string::npos) return 7;
  if (key == "world_size" || key == "env.WORLD_SIZE") return 8;
  if (key == "command_line" || build) return 10;  // the compilers and their flags, last
  return 9;
}

std::vector<EnvDifference> diff_environment(
    const std::map<std::string, std::map<std::string, std::string>>& a, const std::string& run_a,
    const std::map<std::string, std::map<std::string, std::string>>& b, const std::string& run_b) {
  static const std::map<std::string, std::string> kEmpty;
  std::vector<EnvDifference> out;
  std::map<std::string, bool> processes;
  for (const auto& [p, _] : a) processes[p] = true;
  for (const auto& [p, _] : b) processes[p] = true;
  for (const auto& [p, _] : processes) {
    auto ia = a.find(p), ib = b.find(p);
    const auto& fa = ia == a.end() ? kEmpty : ia->second;
    const auto& fb = ib == b.end() ? kEmpty : ib->second;
    if (ia == a.end() || ib == b.end()) {
      out.push_back({p, kProcessPresence, ia == a.end() ? "(absent)" : "present",
                     ib == b.end() ? "(absent)" : "present"});
      continue;
    }
    std::map<std::string, bool> keys;
    for (const auto& [k, _] : fa) keys[k] = true;
    for (const auto& [k, _] : fb) keys[k] = true;
    for (const auto& [k, _] : keys) {
      if (volatile_env_key(k) || k == "host" || k == "node") continue;  // placement_note's
      auto ka = fa.find(k), kb = fb.find(k);
      std::string va = ka == fa.end() ? "(absent)" : normalise(ka->second, run_a);
      std::string vb = kb == fb.end() ? "(absent)" : normalise(kb->second, run_b);
      if (va == vb || k == "build_config.TORCH_VERSION") continue;  // torch_version says it
      if (k.size() > 6 && k.compare(k.size() - 6, 6, "_FLAGS") == 0) {
        // Compiler flags: the words only one build has, not the whole line twice.
        out.push_back(
            {p, k + " (flags only in each)", flags_only_in(va, vb), flags_only_in(vb, va)});
        continue;
      }
      out.push_back({p, k, va, vb});
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const EnvDifference& x, const EnvDifference& y) {
    return suspect_rank(x.key) < suspect_rank(y.key);
  });
  return out;
}

}  // namespace detaudit
