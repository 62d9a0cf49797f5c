#include "run/selftest.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "diff/diff.h"
#include "report/render.h"
#include "run_layout.h"
#include "trace/reader.h"
#include "trace/records.h"

namespace detaudit::run {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kPhases[] = {"forward", "backward", "optimizer"};

// What choose_plants needs of one OP record.
struct Made {
  uint64_t index = 0, order = 0, step = 0;
  uint32_t depth = 0;
  std::string phase, name;
  std::vector<std::string> outputs;  // floating-point outputs' digests (returned and written)
  std::set<std::string> inputs;      // its inputs' digests
  bool float_input = false;
  bool step_state = false;
  bool schema_op = false;         // an op of the dispatcher (an autograd node is not one)
  bool returned_nothing = false;  // no value at all, no written section
  uint64_t largest = 0;           // elements of its largest value
};

bool is_value(const trace::TensorDesc* t) {
  return t && t->has_contents() && trace::dtype_is_floating(t->dtype) &&
         t->provenance() != trace::Provenance::kView && t->numel() > 0;
}

Status read_made(const std::string& path, std::vector<Made>* out) {
  trace::TraceReader r;
  if (Status s = r.open(path); !s.ok()) return Status::error(s.message(), ExitCode::kBadInput);
  trace::ReadResult res;
  uint64_t index = 0;
  while ((res = r.next()) == trace::ReadResult::kRecord) {
    if (r.kind() != trace::RecordKind::kOp) continue;
    const trace::OpRecord& op = r.op();
    Made m;
    m.index = index++;
    m.order = op.order;
    m.step = op.step;
    m.depth = op.depth;
    m.phase = std::string(trace::phase_name(op.phase));
    m.name = std::string(r.string(op.name));
    m.step_state = trace::is_step_state_record(m.name);
    m.schema_op = op.scope == trace::Scope::kFunction;
    m.returned_nothing = op.outputs.empty() && op.output_tensors.empty();
    for (int64_t id : op.input_tensors) {
      const trace::TensorDesc* t = r.tensor(id);
      if (!t) continue;
      m.inputs.insert(t->digest_hex());
      m.float_input = m.float_input || trace::dtype_is_floating(t->dtype);
    }
    for (int64_t id : op.output_tensors)
      if (const trace::TensorDesc* t = r.tensor(id); is_value(t)) {
        m.outputs.push_back(t->digest_hex());
        m.largest = std::max(m.largest, t->numel());
      }
    out->push_back(std::move(m));
  }
  if (res == trace::ReadResult::kCorrupt) return Status::error(r.error(), ExitCode::kBadInput);
  return Status();
}

// Records come in end order: an op's nested ones are the run just before it with later orders.
// It made a value when one of its outputs is neither a nested op's output nor one of its inputs.
std::vector<bool> made_a_value(const std::vector<Made>& ops, std::vector<bool>* leaf) {
  std::vector<bool> made(ops.size(), false);
  leaf->assign(ops.size(), true);
  for (size_t i = 0; i < ops.size(); ++i) {
    std::set<std::string> nested;
    for (size_t j = i; j-- > 0 && ops[j].order > ops[i].order;) {
      (*leaf)[i] = false;
      nested.insert(ops[j].outputs.begin(), ops[j].outputs.end());
    }
    for (const std::string& d : ops[i].outputs)
      if (!nested.count(d) && !ops[i].inputs.count(d)) made[i] = true;
  }
  return made;
}

// rank 0's main thread, else the first stream.
std::string first_stream(const std::string& run0) {
  const std::vector<std::string> files = list_stream_files(run0);
  for (const char* want : {"r0.main.t-main", "r0.main.t"})
    for (const std::string& f : files)
      if (f.rfind(want, 0) == 0) return f.substr(0, f.size() - std::strlen(layout::kTraceExt));
  return files.empty() ? "" : files[0].substr(0, files[0].size() - std::strlen(layout::kTraceExt));
}

// The candidates' step nearest `want`, preferring one at or before it; its middle candidate.
const Made* nearest_middle(const std::vector<const Made*>& candidates, uint64_t want) {
  if (candidates.empty()) return nullptr;
  std::map<uint64_t, std::vector<const Made*>> by_step;
  for (const Made* m : candidates) by_step[m->step].push_back(m);
  auto at = by_step.upper_bound(want);
  if (at != by_step.begin()) --at;
  const std::vector<const Made*>& in_step = at->second;
  return in_step[in_step.size() / 2];
}

}  // namespace

Status choose_plants(const std::string& run0, std::vector<PlantChoice>* plants,
                     std::vector<std::string>* notes) {
  plants->clear();
  const std::string stream = first_stream(run0);
  if (stream.empty())
    return Status::error(fmt::format("{}: no stream to plant in", run0), ExitCode::kBadInput);
  std::vector<Made> ops;
  if (Status s = read_made(
          (fs::path(run0) / layout::kStreamsDir / (stream + layout::kTraceExt)).string(), &ops);
      !s.ok())
    return s;
  std::vector<bool> leaf;
  const std::vector<bool> made = made_a_value(ops, &leaf);
  std::set<uint64_t> steps;
  for (size_t i = 0; i < ops.size(); ++i)
    if (made[i] && ops[i].phase == "forward") steps.insert(ops[i].step);
  // One step before the last that computes: a change there has a forward after it to show up
  // in, if late.
  const uint64_t want = steps.size() >= 2 ? *std::prev(steps.end(), 2)
                        : steps.empty()   ? 0
                                          : *steps.begin();
  std::vector<const Made*> step_states, silent;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].step_state) step_states.push_back(&ops[i]);
    // Returned nothing, wrote nothing it declares: where a write through data_ptr hides.
    if (leaf[i] && ops[i].schema_op && ops[i].returned_nothing && ops[i].float_input &&
        !ops[i].step_state)
      silent.push_back(&ops[i]);
  }
  auto choose = [&](const Made* m, const char* kind, bool input) {
    PlantChoice p;
    p.phase = m->phase;
    p.kind = kind;
    p.input = input;
    Status s = replay::find_replay_target(run0, stream, m->index, &p.op);
    if (s.ok()) plants->push_back(std::move(p));
    return s;
  };
  for (const char* phase : kPhases) {
    std::vector<const Made*> makers;
    for (size_t i = 0; i < ops.size(); ++i)
      if (made[i] && ops[i].phase == phase) makers.push_back(&ops[i]);
    // A scalar (a learning rate's copy, a loss's divisor) only where nothing larger was made.
    std::vector<const Made*> tensors;
    for (const Made* m : makers)
      if (m->largest > 1) tensors.push_back(m);
    const Made* m = nearest_middle(tensors.empty() ? makers : tensors, want);
    bool input = false;
    if (!m && std::string(phase) == "backward" && !step_states.empty()) {
      m = nearest_middle(step_states, want);  // a sentinel's: the gradients its step read
      input = true;
    }
    if (!m) {
      notes->push_back(
          fmt::format("{}: no op of run-0's {} made a value to plant in", phase, stream));
      continue;
    }
    if (Status s = choose(m, phase, input); !s.ok()) return s;
  }
  if (const Made* m = nearest_middle(silent, want))
    if (Status s = choose(m, "silent", false); !s.ok()) return s;
  return Status();
}

json plant_spec_json(const PlantChoice& p, const std::string& dir, double relative) {
  return {
      {"targets",
       json::array({{{"process", p.op.process},
                     {"thread", p.op.thread},
                     {"op", p.op.op},
                     {"occurrence", p.op.occurrence},
                     {"plant", {{"value", p.input ? "input" : "output"}, {"relative", relative}}},
                     {"dir", dir}}})}};
}

namespace {

std::string where_of(const FirstDivergence& f) {
  return fmt::format("{} step {} {} {} (op #{})", f.stream, f.step, f.phase, f.op, f.index);
}

// The diff's first divergence comes before the plant: the runs differ without it.
bool precedes(const FirstDivergence& f, const PlantChoice& p) {
  if (f.step != p.op.step) return f.step < p.op.step;
  return f.stream == p.op.stream && f.index < p.op.index;
}

}  // namespace

SelfTest::Plant judge_plant(const PlantChoice& p, const json& planted, const DiffReport& diff) {
  SelfTest::Plant k;
  k.phase = p.phase;
  k.kind = p.kind;
  k.op = p.op.op;
  k.stream = p.op.stream;
  k.index = p.op.index;
  k.step = p.op.step;
  const std::string at = fmt::format("{} (step {} {}, {} op #{})", p.op.op, p.op.step, p.phase,
                                     p.op.stream, p.op.index);
  if (planted.is_null()) {
    k.outcome = "not-reached";
    k.line = fmt::format("the plant's run never reached {}: it took another path or ended first",
                         at);
    return k;
  }
  const std::string status = planted.value("status", std::string());
  if (status != "planted") {
    k.outcome = status == "nothing-to-change" ? "not-planted" : "not-reached";
    k.line = fmt::format("nothing planted in {}: {}", at, planted.value("why", status));
    return k;
  }
  k.value = planted.value("value", std::string());
  k.declared = planted.value("declared", true);
  k.before = planted.value("before", 0.0);
  k.after = planted.value("after", 0.0);
  const std::string change = fmt::format("{} of {} ({:.9g} to {:.9g}){}", k.value, at, k.before,
                                         k.after,
                                         k.declared ? "" : ", a write its schema does not declare");
  if (!diff.first) {
    k.outcome = "not-found";
    k.line = fmt::format("NOT FOUND: a change in {} was not seen: the diff says {}", change,
                         verdict_name(diff.verdict));
    return k;
  }
  const FirstDivergence& f = *diff.first;
  k.seen_at = where_of(f);
  if (f.stream == p.op.stream && f.index == p.op.index) {
    k.outcome = "found";
    k.line = fmt::format("found at its op: {}", change);
  } else if (precedes(f, p)) {
    k.outcome = "preceded";
    k.line = fmt::format("not judged: the runs differ at {}, before the change in {}", k.seen_at,
                         change);
  } else {
    k.outcome = "late";
    k.line = fmt::format(
        "found late, a blind spot: a change in {} was first seen at {}: {}'s {} is not "
        "recorded as the op made it",
        change, k.seen_at, p.op.op, k.declared ? "value" : "write");
  }
  return k;
}

void summarize(SelfTest* t) {
  int planted = 0, found = 0, late = 0, failed = 0;
  for (const SelfTest::Plant& k : t->plants) {
    planted += k.outcome != "not-planted";
    found += k.outcome == "found";
    late += k.outcome == "late";
    failed += SelfTest::fails(k.outcome);
  }
  t->passed = failed == 0 && found + late > 0;
  if (planted == 0)
    t->outcome = "FAILED: nothing planted, so nothing proved";
  else if (failed)
    t->outcome = fmt::format("FAILED: {} of {} plants not found where they were planted", failed,
                             planted);
  else
    t->outcome = fmt::format("{} of {} plants found at their op{}", found, planted,
                             late ? fmt::format(", {} late (a blind spot, named)", late) : "");
}

namespace {

json read_planted(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "plant.json");
  if (!in) return nullptr;
  try {
    return json::parse(in);
  } catch (const std::exception&) {
    return nullptr;
  }
}

}  // namespace

Status run_selftest(const Config& config, const RunOptions& options, const std::string& run0,
                    const Catalog* catalog, const PlantRunFn& on_run, SelfTest* out) {
  *out = SelfTest{};
  std::vector<PlantChoice> plants;
  if (Status s = choose_plants(run0, &plants, &out->notes); !s.ok()) return s;
  for (const PlantChoice& p : plants) {
    Config c = config;
    c.runs = 1;
    c.out = (fs::path(config.out) / ("selftest-" + p.kind)).string();
    const std::string dir = fs::absolute(c.out).string();
    std::error_code ec;
    fs::create_directories(dir, ec);
    fs::remove(fs::path(dir) / "plant.json", ec);
    const std::string spec = (fs::path(dir) / "plant-spec.json").string();
    std::ofstream(spec) << plant_spec_json(p, dir, 1e-3).dump(2) << "\n";
    c.target.env["DETAUDIT_CAPTURE"] = spec;
    fmt::print(stderr, "detaudit: self-test: a change planted in {} (step {} {}): {}\n", p.op.op,
               p.op.step, p.phase, c.out);
    RunOutcome o;
    if (Status s = execute_run(c, options, 0, &o); !s.ok()) return s;
    if (on_run) on_run(o, 0);
    DiffReport diff;
    if (!o.streams.empty()) {
      DiffOptions diff_options;
      diff_options.gate = config.gate;
      diff_options.gate.fail_on = "any";
      diff_options.catalog = catalog;
      if (Status s = diff_runs(run0, o.dir, diff_options, &diff); !s.ok()) return s;
    }
    SelfTest::Plant k = judge_plant(p, read_planted(dir), diff);
    k.run = o.dir;
    fmt::print(stderr, "detaudit: self-test: {}: {}\n", p.kind, k.line);
    out->plants.push_back(std::move(k));
  }
  summarize(out);
  fmt::print(stderr, "detaudit: self-test: {}\n", out->outcome);
  std::ofstream((fs::path(config.out) / "selftest.json").string())
      << selftest_to_json(*out).dump(2) << "\n";
  return Status();
}

}  // namespace detaudit::run
