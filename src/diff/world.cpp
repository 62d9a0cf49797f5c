#include "diff/world.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "config/config.h"
#include "trace/reader.h"

namespace detaudit {
namespace fs = std::filesystem;

namespace {

using Environment = std::map<std::string, std::map<std::string, std::string>>;

std::string field(const std::map<std::string, std::string>& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() ? "" : it->second;
}

// The node's name when a launcher recorded it, else its host's.
std::string where(const std::map<std::string, std::string>& env) {
  std::string node = field(env, "node");
  if (node.empty() || node == "null") node = field(env, "host");
  return node;
}

// The config the run's interposers read: config.json, or any node's (they are alike).
bool load_run_config(const trace::RunDirectory& run, Config* config) {
  if (fs::exists(run.run_config())) return load_config(run.run_config(), config).ok();
  return !run.node_configs().empty() && load_config(run.node_configs().front().path, config).ok();
}

// The trace format of the run's first stream; 0 when none can be read.
uint32_t format_of(const trace::RunDirectory& run) {
  if (run.traces().empty()) return 0;
  trace::TraceReader r;
  return r.open(run.traces().front().path).ok() ? r.header().version : 0;
}

std::string rank_list(const std::vector<int64_t>& ranks) {
  return fmt::format("{}", fmt::join(ranks, ", "));
}

}  // namespace

Status check_recorded_alike(const trace::RunDirectory& a, const trace::RunDirectory& b,
                            bool* sentinel) {
  Config ca, cb;
  *sentinel = false;
  if (!load_run_config(a, &ca) || !load_run_config(b, &cb)) return Status();
  *sentinel = ca.sentinel && cb.sentinel && !ca.full_steps && !cb.full_steps;
  if (*sentinel) {
    const uint32_t fa = format_of(a), fb = format_of(b);
    if (fa && fb && (fa < trace::kStepStateFormat) != (fb < trace::kStepStateFormat)) {
      const trace::RunDirectory& older = fa < fb ? a : b;
      return Status::error(
          fmt::format("{} is a sentinel run of an older detaudit (trace format {}: each optimizer "
                      "op recorded), which does not pair with this one's (one record a step): "
                      "record it again with this detaudit",
                      older.path(), std::min(fa, fb)),
          ExitCode::kUsage);
    }
  }
  if (ca.sentinel == cb.sentinel) return Status();
  const trace::RunDirectory& only_ends = ca.sentinel ? a : b;
  const trace::RunDirectory& full = ca.sentinel ? b : a;
  return Status::error(
      fmt::format("{} was recorded with --sentinel (each step's end only) and {} in full: "
                  "record both alike (`detaudit record --sentinel` for a run to compare with a "
                  "sentinel baseline)",
                  only_ends.path(), full.path()),
      ExitCode::kUsage);
}

Status check_world(const trace::RunDirectory& run, const Environment& environment,
                   WorldCheck* out) {
  out->world_size = 0;
  out->missing.clear();
  out->unfinished.clear();
  std::set<int64_t> present;
  std::map<std::string, std::vector<int64_t>> ranks_of_node;
  for (const auto& [process, env] : environment) {
    const std::string rank = field(env, "rank");
    if (rank.empty() || process == "run") continue;
    const int64_t r = std::strtoll(rank.c_str(), nullptr, 10);
    present.insert(r);
    out->world_size = std::max<int64_t>(
        out->world_size, std::strtoll(field(env, "world_size").c_str(), nullptr, 10));
    const std::string node = field(env, "node");
    if (!node.empty() && node != "null") ranks_of_node[node].push_back(r);
  }
  Config config;
  const bool have_config = load_run_config(run, &config);
  for (int64_t r = 0; r < out->world_size; ++r)
    if (!present.count(r) && (!have_config || config.select.ranks.contains(uint64_t(r))))
      out->missing.push_back(r);

  for (const trace::RunFile& manifest : run.node_manifests()) {
    std::ifstream in(manifest.path);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return Status::error(fmt::format("{}: offset 0: not a JSON object (a corrupt node "
                                       "manifest); record that node's part again",
                                       manifest.path),
                           ExitCode::kBadInput);
    if (j.value("finished", false)) continue;
    const std::string& node = manifest.name;
    std::vector<int64_t>& ranks = ranks_of_node[node];
    std::sort(ranks.begin(), ranks.end());
    out->unfinished.push_back(
        ranks.empty()
            ? node
            : fmt::format("{} (rank{} {})", node, ranks.size() > 1 ? "s" : "", rank_list(ranks)));
  }
  std::sort(out->unfinished.begin(), out->unfinished.end());
  return Status();
}

std::vector<std::string> describe_world(const WorldCheck& check) {
  const std::string& run = check.run;
  std::vector<std::string> lines;
  if (!check.missing.empty())
    lines.push_back(fmt::format(
        "run {}: rank{} {} of a world of {} left no trace (never started, or its node wrote "
        "into another directory); record every node into the same run directory",
        run, check.missing.size() > 1 ? "s" : "", rank_list(check.missing), check.world_size));
  for (const std::string& node : check.unfinished)
    lines.push_back(fmt::format(
        "run {}: node {} never finished: its launcher was killed or its node lost, so its ranks' "
        "last ops may be missing",
        run, node));
  return lines;
}

std::string placement_note(const Environment& a, const Environment& b) {
  std::vector<std::string> moved;
  for (const auto& [process, env_a] : a) {
    auto it = b.find(process);
    if (it == b.end()) continue;
    const std::string wa = where(env_a), wb = where(it->second);
    if (wa != wb)
      moved.push_back(fmt::format("{} ran on {} in run A, on {} in run B", process, wa, wb));
  }
  if (moved.empty()) return "";
  return fmt::format("placement: {}{}; where a rank runs is not a cause, and not compared",
                     moved.front(),
                     moved.size() > 1 ? fmt::format(" (and {} more)", moved.size() - 1) : "");
}

}  // namespace detaudit
