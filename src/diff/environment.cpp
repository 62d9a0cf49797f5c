// Loading, flattening and comparing environment fingerprints.
#include "diff/environment.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>

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

}  // namespace

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
      if (va != vb) out.push_back({p, k, va, vb});
    }
  }
  // Threads and determinism settings first: they are the usual causes.
  std::stable_sort(out.begin(), out.end(), [](const EnvDifference& x, const EnvDifference& y) {
    auto rank = [](const std::string& k) {
      if (k.find("threads") != std::string::npos) return 0;
      if (k.rfind("determinism.", 0) == 0) return 1;
      if (k.find("SEED") != std::string::npos || k.find("seed") != std::string::npos) return 2;
      if (k.rfind("cuda.", 0) == 0) return 3;  // the GPU and CUDA libraries
      return 4;
    };
    return rank(x.key) < rank(y.key);
  });
  return out;
}

}  // namespace detaudit
