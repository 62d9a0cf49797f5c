#include "replay/coverage.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <unordered_map>

#include "run_layout.h"
#include "trace/reader.h"
#include "trace/run_directory.h"

namespace detaudit::replay {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// An op the catalog lists is replayed up to this many times more under contention while its
// outputs agree.
constexpr int kSuspectReplayFactor = 9;

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// Why an op cannot be replayed on its own, from its name alone; "" when it can.
std::string unverifiable_by_name(std::string_view name) {
  if (starts_with(name, "c10d::") || starts_with(name, "_c10d_functional::") ||
      starts_with(name, "c10d_functional::"))
    return "a collective: its result is what the other ranks sent, not one process's kernel";
  if (starts_with(name, "Torch-Compiled Region") || name == "CompiledFunction" ||
      name == "CompiledFunctionBackward")
    return "a torch.compile region: its generated kernels are rows of their own where recorded "
           "(inductor_kernel::*)";
  if (trace::is_compiled_kernel(name))
    return "a kernel torch.compile generated: its code lives in the program's compile cache, "
           "where the replayer cannot call it (run --verify-remedy checks its remedy)";
  if (name.find("::") == std::string_view::npos)
    return "not a dispatcher op (an autograd node or a scope of the program's): the ops it ran "
           "are rows of their own";
  return "";
}

uint64_t tensor_bytes(const trace::TensorDesc& t) { return t.numel() * trace::dtype_size(t.dtype); }

std::string shape_class(const trace::TensorDesc& t) {
  const uint64_t n = t.numel();
  const int power = n <= 1 ? 0 : 64 - __builtin_clzll(n - 1);  // the power of two at or above n
  return fmt::format("{}-D, <=2^{}", t.sizes.size(), power);
}

std::string plural(uint64_t n, const char* one, const char* many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

std::string setting_label(const ReplaySeries& s) {
  return fmt::format("{} ({}{}{})", s.setting, plural(uint64_t(s.threads), "thread", "threads"),
                     s.busy_thread ? ", a busy core" : "",
                     s.deterministic ? ", deterministic algorithms" : "");
}

}  // namespace

const char* coverage_name(Coverage c) {
  switch (c) {
    case Coverage::kNondeterministic: return "verified-nondeterministic";
    case Coverage::kDeterministic: return "deterministic";
    case Coverage::kUnverified: return "unverified";
  }
  return "unverified";
}

std::string OpTypeRow::key() const {
  return fmt::format("{} {} {} {}", op, dtype, device, shape_class);
}

Status plan_coverage(const std::string& run_dir, const Catalog& catalog, CoveragePlan* out) {
  CoveragePlan plan;
  plan.run_dir = run_dir;
  trace::RunDirectory run;
  if (Status s = trace::RunDirectory::open(run_dir, &run); !s.ok()) return s;

  std::map<std::string, size_t> by_key;  // OpTypeRow::key() -> row
  for (const trace::RunFile& file : run.traces()) {
    trace::TraceReader r;
    if (Status s = r.open(file.path); !s.ok())
      return Status::error(s.message(), ExitCode::kBadInput);
    if (plan.digest.empty()) plan.digest = std::string(trace::digest_name(r.header().algo));
    const std::string& stream = file.name;
    // Per op name, the orders of its records: a chosen record's occurrence is its rank in start
    // order among them, as the interposer counts.
    std::unordered_map<uint32_t, std::vector<uint64_t>> orders;
    std::unordered_map<size_t, std::pair<uint32_t, uint64_t>> chosen_here;  // row -> name, order
    uint64_t index = 0;
    trace::ReadResult res;
    while ((res = r.next()) == trace::ReadResult::kRecord) {
      if (r.kind() != trace::RecordKind::kOp) continue;
      const trace::OpRecord& op = r.op();
      const uint64_t this_index = index++;
      ++plan.ops_scanned;
      orders[op.name].push_back(op.order);
      // The type's dtype and device are its first tensor's (self, or its first output); its
      // shape class is the largest tensor's it read or wrote.
      const trace::TensorDesc* first_tensor = nullptr;
      const trace::TensorDesc* largest = nullptr;
      uint64_t read_bytes = 0;
      bool any_output = false;
      std::vector<int> compared;
      for (int64_t id : op.input_tensors)
        if (const trace::TensorDesc* t = r.tensor(id)) {
          if (!first_tensor) first_tensor = t;
          read_bytes += tensor_bytes(*t);
          if (!largest || t->numel() > largest->numel()) largest = t;
        }
      for (size_t k = 0; k < op.output_tensors.size(); ++k)
        if (const trace::TensorDesc* t = r.tensor(op.output_tensors[k])) {
          if (!first_tensor) first_tensor = t;
          if (!largest || t->numel() > largest->numel()) largest = t;
          if (t->has_contents()) compared.push_back(int(k));
          any_output = true;
        }
      const std::string_view name = r.string(op.name);
      OpTypeRow probe;
      probe.op = std::string(name);
      probe.dtype = first_tensor ? std::string(trace::dtype_name(first_tensor->dtype)) : "-";
      probe.device = first_tensor ? std::string(trace::device_type_name(first_tensor->device_type))
                                  : "cpu";
      probe.shape_class = largest ? shape_class(*largest) : "no tensors";
      auto [it, added] = by_key.try_emplace(probe.key(), plan.rows.size());
      if (added) {
        probe.random = op.is_random();
        probe.unverifiable = (op.bits & trace::kOpCompiledRegion)
                                 ? unverifiable_by_name("CompiledFunction")
                                 : unverifiable_by_name(name);
        if (probe.unverifiable.empty() && compared.empty())
          probe.unverifiable = any_output ? "its outputs are uninitialized memory or geometry "
                                            "only: there are no bytes to compare"
                                          : "it returns no tensor: there are no bytes to compare";
        // Entries of another device do not explain this type (cuBLAS's mm is not the CPU's).
        auto on_device = [&](const CatalogEntry* e) {
          return e->devices.empty() ||
                 std::any_of(e->devices.begin(), e->devices.end(),
                             [&](const std::string& d) { return d == "any" || d == probe.device; });
        };
        for (const CatalogEntry* e : catalog.lookup(name))
          if (e->kind == "op" && e->nondeterministic && on_device(e)) {
            probe.catalog_ids.push_back(e->id);
            if (probe.remedy.empty()) probe.remedy = e->remedy;
          }
        plan.rows.push_back(std::move(probe));
      }
      OpTypeRow& row = plan.rows[it->second];
      const bool first = row.occurrences++ == 0;
      if (!first && read_bytes <= row.bytes) continue;
      row.bytes = read_bytes;
      row.compared_outputs = compared;
      ReplayTarget& t = row.target;
      t = ReplayTarget{};
      t.run_dir = run_dir;
      t.stream = stream;
      t.index = this_index;
      t.process = stream.substr(0, stream.find(".t-"));
      t.thread = stream.substr(std::min(stream.size(), t.process.size() + 3));
      t.thread = t.thread.substr(0, t.thread.find('~'));  // "main~1" counts as "main"
      t.op = row.op;
      t.step = op.step;
      t.phase = std::string(trace::phase_name(op.phase));
      t.digest = plan.digest;
      for (int64_t id : op.input_tensors) t.inputs.push_back(trace::contents_hex(r.tensor(id)));
      for (int64_t id : op.output_tensors)
        t.recorded_outputs.push_back(trace::contents_hex(r.tensor(id)));
      chosen_here[it->second] = {op.name, op.order};
    }
    if (res == trace::ReadResult::kCorrupt) return Status::error(r.error(), ExitCode::kBadInput);
    // A cut stream is planned up to its cut: its ops ran as recorded.
    for (const auto& [row, chosen] : chosen_here) {
      if (plan.rows[row].target.stream != stream) continue;  // a larger one came later elsewhere
      std::vector<uint64_t>& same = orders[chosen.first];
      std::sort(same.begin(), same.end());
      plan.rows[row].target.occurrence = uint64_t(
          std::lower_bound(same.begin(), same.end(), chosen.second) - same.begin());
    }
  }
  for (OpTypeRow& row : plan.rows) read_fingerprint(run_dir, &row.target);
  std::stable_sort(plan.rows.begin(), plan.rows.end(),
                   [](const OpTypeRow& a, const OpTypeRow& b) { return a.bytes > b.bytes; });
  *out = std::move(plan);
  return Status();
}

json capture_targets_json(const CoveragePlan& plan, const std::string& dir) {
  json targets = json::array();
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const OpTypeRow& row = plan.rows[i];
    if (!row.unverifiable.empty()) continue;
    targets.push_back(capture_spec_json(row.target, (fs::path(dir) / std::to_string(i)).string()));
  }
  return {{"targets", targets}};
}

void read_captures(const std::string& dir, CoveragePlan* plan) {
  for (size_t i = 0; i < plan->rows.size(); ++i) {
    OpTypeRow& row = plan->rows[i];
    if (!row.unverifiable.empty()) continue;
    const fs::path row_dir = fs::path(dir) / std::to_string(i);
    ReplayReport r;
    r.target = row.target;
    read_capture(row_dir.string(), &r);  // "not-reached" when the run never got there
    row.capture_status = r.capture_status;
    row.capture_why = r.capture_why;
    row.inputs_file = r.inputs_file;
    std::ifstream in(row_dir / "capture.json");
    json c = json::parse(in, nullptr, false);
    if (c.is_object()) {
      row.overload = c.value("overload", "");
      row.rng_file = c.value("rng_file", "");
    }
  }
}

json replay_manifest(const CoveragePlan& plan, const std::vector<size_t>& rows, int replays,
                     int64_t deadline_ms) {
  json ops = json::array();
  for (size_t i : rows) {
    const OpTypeRow& row = plan.rows[i];
    const int threads = row.target.intra_op_threads;
    const bool det = row.target.deterministic;
    // The settings of `detaudit replay`: as recorded, with more threads than cores and a core
    // kept busy, and under use_deterministic_algorithms. An op the catalog lists is replayed up
    // to ten times as often under contention while its outputs agree: on a loaded machine its
    // threads can add in the same order for a whole series.
    json settings = json::array(
        {{{"setting", "as recorded"}, {"threads", threads}, {"deterministic", det}},
         {{"setting", "under contention"},
          {"threads", std::max(2, 2 * threads)},
          {"deterministic", det},
          {"busy", true},
          {"until_differs", row.catalog_ids.empty() ? 0 : kSuspectReplayFactor * replays}},
         {{"setting", "under the remedy"}, {"threads", threads}, {"deterministic", true}}});
    ops.push_back({{"id", std::to_string(i)},
                   {"inputs", row.inputs_file},
                   {"rng", row.rng_file},
                   {"op", row.target.op},
                   {"overload", row.overload},
                   {"outputs", row.compared_outputs},
                   {"settings", settings}});
  }
  return {
      {"digest", plan.digest}, {"replays", replays}, {"deadline_ms", deadline_ms}, {"ops", ops}};
}

bool add_replay_line(const std::string& line, CoveragePlan* plan) {
  json j = json::parse(line, nullptr, false);
  if (!j.is_object() || !j.contains("id")) return false;
  size_t i = 0;
  try {
    i = std::stoul(j["id"].get<std::string>());
  } catch (const std::exception&) {
    return false;
  }
  if (i >= plan->rows.size()) return false;
  ReplaySeries s;
  s.setting = j.value("setting", "");
  s.replays = j.value("replays", 0);
  s.threads = j.value("threads", 0);
  s.deterministic = j.value("deterministic", false);
  s.busy_thread = j.value("busy_thread", false);
  s.distinct = j.value("distinct", 0);
  s.max_abs_diff = j.value("max_abs_diff", 0.0);
  s.cores_used = j.value("cores_used", 0.0);
  s.error = j.value("error", "");
  // Replays that gave the recorded run's bits: a random op with its generator state does.
  const OpTypeRow& row = plan->rows[i];
  if (j.contains("outputs") && j["outputs"].is_array())
    for (const json& digests : j["outputs"]) {
      bool same = digests.is_array() && digests.size() == row.compared_outputs.size();
      for (size_t k = 0; same && k < digests.size(); ++k) {
        const size_t out = size_t(row.compared_outputs[k]);
        same = out < row.target.recorded_outputs.size() && digests[k].is_string() &&
               digests[k].get<std::string>() == row.target.recorded_outputs[out];
      }
      if (same) ++s.matching_recorded;
    }
  plan->rows[i].series.push_back(std::move(s));
  return true;
}

namespace {

void judge_row(OpTypeRow* row, bool budget_left) {
  if (!row->unverifiable.empty()) {
    row->verdict = Coverage::kUnverified;
    row->why = row->unverifiable;
    return;
  }
  if (row->capture_status != "saved") {
    row->verdict = Coverage::kUnverified;
    row->why = row->capture_status.empty()
                   ? "the time budget ran out before its inputs were captured"
                   : fmt::format("not captured ({}): {}", row->capture_status, row->capture_why);
    return;
  }
  const ReplaySeries* worst = nullptr;
  std::vector<const ReplaySeries*> ran;
  std::vector<std::string> refused;
  for (const ReplaySeries& s : row->series) {
    if (!s.error.empty() || s.replays == 0) {
      refused.push_back(fmt::format("{}: the op refused ({})", s.setting, s.error));
      continue;
    }
    ran.push_back(&s);
    if (s.distinct > 1 && (!worst || s.distinct > worst->distinct)) worst = &s;
  }
  if (worst) {
    row->verdict = Coverage::kNondeterministic;
    row->why = fmt::format("{} distinct outputs in {} replays {} (max |diff| {:.3g})",
                           worst->distinct, worst->replays, setting_label(*worst),
                           worst->max_abs_diff);
    return;
  }
  if (!row->replay_died.empty() && ran.size() < 3) {
    row->verdict = Coverage::kUnverified;
    row->why = row->replay_died;
    return;
  }
  if (ran.empty()) {
    row->verdict = Coverage::kUnverified;
    row->why = !refused.empty() ? refused.front()
               : budget_left    ? "the replayer gave no result for it"
                                : "the time budget ran out before its replays";
    return;
  }
  row->verdict = Coverage::kDeterministic;
  std::vector<std::string> settings;
  bool same_count = true;
  for (const ReplaySeries* s : ran) same_count = same_count && s->replays == ran.front()->replays;
  for (const ReplaySeries* s : ran) {
    std::string label = setting_label(*s);
    if (!same_count) label += fmt::format(": {}", s->replays);
    // A listed race that never showed: the cores its threads got weigh the evidence.
    if (!row->catalog_ids.empty() && s->threads > 1 && s->cores_used > 0)
      label += fmt::format(", using {:.1f} cores", s->cores_used);
    settings.push_back(std::move(label));
  }
  row->why = same_count ? fmt::format("identical in {} replays each: {}", ran.front()->replays,
                                      fmt::join(settings, "; "))
                        : fmt::format("identical in every replay: {}", fmt::join(settings, "; "));
  if (!refused.empty()) row->why += "; " + fmt::format("{}", fmt::join(refused, "; "));
}

int verdict_rank(Coverage c) {
  return c == Coverage::kNondeterministic ? 0 : c == Coverage::kUnverified ? 1 : 2;
}

}  // namespace

CoverageReport judge_coverage(CoveragePlan plan, int replays, double budget_s, double spent_s,
                              int workers) {
  CoverageReport r;
  r.run_dir = plan.run_dir;
  r.digest = plan.digest;
  r.replays = replays;
  r.budget_s = budget_s;
  r.spent_s = spent_s;
  r.workers = workers;
  r.ops_scanned = plan.ops_scanned;
  const bool budget_left = spent_s < budget_s;
  for (OpTypeRow& row : plan.rows) {
    judge_row(&row, budget_left);
    switch (row.verdict) {
      case Coverage::kNondeterministic:
        ++r.nondeterministic;
        if (row.catalog_ids.empty()) ++r.unknown_to_catalog;
        break;
      case Coverage::kDeterministic: ++r.deterministic; break;
      case Coverage::kUnverified: ++r.unverified; break;
    }
  }
  r.rows = std::move(plan.rows);
  std::stable_sort(r.rows.begin(), r.rows.end(), [](const OpTypeRow& a, const OpTypeRow& b) {
    return verdict_rank(a.verdict) < verdict_rank(b.verdict);
  });
  return r;
}

}  // namespace detaudit::replay
