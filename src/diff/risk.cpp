// Single-run risk report: catalog lookups per op name, cached per stream's string ids.
#include "diff/risk.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "diff/environment.h"
#include "run_layout.h"
#include "trace/reader.h"
#include "trace/run_directory.h"

namespace detaudit {

namespace {

struct Key {
  std::string entry, op;
  bool operator<(const Key& o) const { return std::tie(entry, op) < std::tie(o.entry, o.op); }
};

void environment_risks(const std::string& process, const std::map<std::string, std::string>& env,
                       const Catalog& catalog, std::vector<EnvironmentRisk>* out) {
  auto get = [&](const char* k) -> const std::string* {
    auto it = env.find(k);
    return it == env.end() ? nullptr : &it->second;
  };
  auto add = [&](const char* id, const char* key, const std::string& value, std::string why) {
    const CatalogEntry* e = catalog.find(id);
    out->push_back({id, process, key, value, std::move(why), e ? e->remedy : ""});
  };
  bool cuda = get("cuda.available") && *get("cuda.available") == "true";
  if (const std::string* v = get("determinism.deterministic_algorithms"); v && *v == "false")
    add("deterministic-algorithms-off", "determinism.deterministic_algorithms", *v,
        "ops with a deterministic alternative take their nondeterministic path");
  if (const std::string* v = get("intra_op_threads"); v && *v != "1")
    add("intra-op-threads", "intra_op_threads", *v,
        "parallel CPU kernels: results depend on the thread count, and some accumulate "
        "kernels use atomics with more than one thread");
  if (const std::string* v = get("determinism.benchmark_cudnn"); v && *v == "true" && cuda)
    add("cudnn-benchmark", "determinism.benchmark_cudnn", *v,
        "cuDNN benchmarking may pick a different algorithm each run");
  if (const std::string* v = get("env.CUBLAS_WORKSPACE_CONFIG"); cuda && (!v || *v == "null"))
    add("cublas-workspace", "env.CUBLAS_WORKSPACE_CONFIG", v ? *v : "(unset)",
        "older PyTorch shares cuBLAS workspaces across streams");
  if (const std::string* v = get("env.PYTHONHASHSEED");
      v && *v == "null" && get("command_line") &&
      get("command_line")->find("python") != std::string::npos)
    add("pythonhashseed", "env.PYTHONHASHSEED", "(unset)",
        "string hashes are salted per process: set/dict order of strings can differ");
}

}  // namespace

Status risk_report(const std::string& run_dir, const Catalog& catalog, RiskReport* out) {
  RiskReport r;
  r.run_dir = run_dir;
  trace::RunDirectory run;
  if (Status s = trace::RunDirectory::open(run_dir, &run); !s.ok()) return s;

  std::map<std::string, std::map<std::string, std::string>> env;
  if (Status s = load_environment(run, &env); !s.ok()) return s;
  std::map<Key, RiskHit> hits;
  for (const trace::RunFile& file : run.traces()) {
    trace::TraceReader reader;
    if (Status s = reader.open(file.path); !s.ok()) return s;
    auto fingerprint = env.find(
        layout::process_name(reader.header().rank, reader.header().process_role));
    const std::string& stream = file.name;
    // Entries per string id, looked up once per name.
    std::vector<std::vector<const CatalogEntry*>> by_name;
    std::vector<bool> looked_up;
    trace::ReadResult res;
    while ((res = reader.next()) == trace::ReadResult::kRecord) {
      if (reader.kind() != trace::RecordKind::kOp) continue;
      ++r.ops_scanned;
      const trace::OpRecord& op = reader.op();
      if (op.name >= looked_up.size()) {
        looked_up.resize(op.name + 1, false);
        by_name.resize(op.name + 1);
      }
      if (!looked_up[op.name]) {
        looked_up[op.name] = true;
        for (const CatalogEntry* e : catalog.lookup(reader.string(op.name)))
          if (e->kind == "op" && e->nondeterministic) by_name[op.name].push_back(e);
      }
      for (const CatalogEntry* e : by_name[op.name]) {
        OpFacts f;
        f.name = reader.string(op.name);
        f.op = &op;
        f.reader = &reader;
        if (!reader.steps().empty()) f.intra_op_threads = reader.steps().back().intra_op_threads;
        if (fingerprint != env.end()) f.fingerprint = &fingerprint->second;
        CatalogMatch m = evaluate(*e, f);
        if (!m.applies) continue;
        RiskHit& h = hits[{e->id, std::string(f.name)}];
        if (h.count++ == 0) {
          h.entry_id = e->id;
          h.op = std::string(f.name);
          h.stream = stream;
          h.first_step = op.step;
          h.conditions_met = m.met;
          h.conditions_unknown = m.unknown;
          h.remedy = e->remedy;
          h.uncertain = e->uncertain;
        }
      }
    }
    if (res == trace::ReadResult::kCorrupt)
      return Status::error(reader.error(), ExitCode::kBadInput);
    if (res == trace::ReadResult::kTruncated)
      r.truncated.push_back(reader.error());
    else if (!reader.saw_end())
      r.truncated.push_back(
          fmt::format("{}: offset {}: no END record: the process did not exit "
                      "cleanly, so its last ops may be missing",
                      file.path, reader.bytes_read()));
  }
  for (auto& [_, h] : hits) r.hits.push_back(std::move(h));
  std::stable_sort(r.hits.begin(), r.hits.end(),
                   [](const RiskHit& a, const RiskHit& b) { return a.count > b.count; });

  for (const auto& [process, flat] : env)
    if (process != "run") environment_risks(process, flat, catalog, &r.environment);
  if (Status s = check_replicas(run, &r.replicas); !s.ok()) return s;
  *out = std::move(r);
  return Status();
}

std::string render_risk_report(const RiskReport& r, bool color) {
  auto bold = [&](const std::string& s) { return color ? "\x1b[1m" + s + "\x1b[0m" : s; };
  auto warn = [&](const std::string& s) { return color ? "\x1b[33m" + s + "\x1b[0m" : s; };
  std::string out = fmt::format("{} {}: {} ops scanned, {} known nondeterministic op(s) ran\n",
                                bold("RISK"), r.run_dir, r.ops_scanned, r.hits.size());
  for (const RiskHit& h : r.hits) {
    out += fmt::format("  {} x{} [{}] first in {} step {}{}\n", warn(h.op), h.count, h.entry_id,
                       h.stream, h.first_step, h.uncertain ? " (uncertain)" : "");
    if (!h.conditions_met.empty())
      out += fmt::format("    conditions met: {}\n", fmt::join(h.conditions_met, "; "));
    if (!h.conditions_unknown.empty())
      out += fmt::format("    not checkable: {}\n", fmt::join(h.conditions_unknown, "; "));
    out += fmt::format("    remedy: {}\n", h.remedy);
  }
  for (const EnvironmentRisk& e : r.environment)
    out += fmt::format("  {} {}={} [{}]: {}\n    remedy: {}\n", e.process, e.key, e.value,
                       e.entry_id, e.why, e.remedy);
  for (const std::string& t : r.truncated) out += warn("  truncated: " + t) + "\n";
  out += render_replica_check(r.replicas);
  return out;
}

nlohmann::json risk_report_to_json(const RiskReport& r) {
  nlohmann::json hits = nlohmann::json::array(), env = nlohmann::json::array();
  for (const RiskHit& h : r.hits)
    hits.push_back({{"entry", h.entry_id},
                    {"op", h.op},
                    {"stream", h.stream},
                    {"count", h.count},
                    {"first_step", h.first_step},
                    {"conditions_met", h.conditions_met},
                    {"conditions_unknown", h.conditions_unknown},
                    {"remedy", h.remedy},
                    {"uncertain", h.uncertain}});
  for (const EnvironmentRisk& e : r.environment)
    env.push_back({{"entry", e.entry_id},
                   {"process", e.process},
                   {"key", e.key},
                   {"value", e.value},
                   {"why", e.why},
                   {"remedy", e.remedy}});
  return {{"schema", "detaudit.risk/1"},
          {"run", r.run_dir},
          {"ops_scanned", r.ops_scanned},
          {"ops", hits},
          {"environment", env},
          {"truncated", r.truncated},
          {"replicas", replica_check_to_json(r.replicas)}};
}

}  // namespace detaudit
