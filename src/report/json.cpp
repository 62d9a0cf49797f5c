// The JSON report (schema in docs/report.md), and helpers shared by the renderers.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "diff/diff.h"
#include "report/render.h"

namespace detaudit {
namespace {

using nlohmann::json;

// JSON has no NaN or Inf: write them as strings.
json json_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

// The numerics change's step, op by op from it: [{"index", "op", "phase", "relative"}].
json growth_json(const std::vector<GrowthPoint>& growth) {
  json out = json::array();
  for (const GrowthPoint& g : growth)
    out.push_back({{"index", g.index},
                   {"op", g.op},
                   {"phase", g.phase},
                   {"relative", json_number(g.relative)}});
  return out;
}

json stats_json(const trace::TensorStats& s) {
  return json{{"min", json_number(s.min)},
              {"max", json_number(s.max)},
              {"mean", json_number(s.mean)},
              {"l2", json_number(s.l2)},
              {"nan", s.nan},
              {"inf", s.inf}};
}

json side_json(const TensorSide& s) {
  if (!s.present) return nullptr;
  json j{{"digest", s.digest}, {"shape", s.sizes},           {"dtype", s.dtype},
         {"device", s.device}, {"provenance", s.provenance}, {"uninitialized", s.uninitialized},
         {"origin", s.origin}};
  j["stats"] = s.has_stats ? stats_json(s.stats) : json(nullptr);
  return j;
}

json pairs_json(const std::vector<TensorPair>& ps) {
  json a = json::array();
  for (const TensorPair& p : ps) {
    json e = {
        {"index", p.index}, {"differs", p.differs}, {"a", side_json(p.a)}, {"b", side_json(p.b)}};
    if (!p.written_argument.empty()) e["written_argument"] = p.written_argument;
    if (p.tensor_role != TensorRole::kUnknown) e["tensor_role"] = tensor_role_name(p.tensor_role);
    a.push_back(std::move(e));
  }
  return a;
}

}  // namespace

std::string deviation_text(double relative, double ulps) {
  return ulps >= 0 ? fmt::format("{:.2g} of its scale ({:.3g} ulp)", relative, ulps)
                   : fmt::format("{:.2g} of its scale", relative);
}

std::string shape_string(const std::vector<int64_t>& sizes) {
  return fmt::format("[{}]", fmt::join(sizes, ", "));
}

std::string short_digest(const std::string& hex) { return hex.substr(0, 12); }

std::vector<std::string> spread_lines(const FirstDivergence& f) {
  constexpr size_t kShown = 8;
  std::vector<std::string> out;
  for (size_t i = 0; i < f.evidence.propagated_through.size() && i < kShown; ++i)
    out.push_back(f.evidence.propagated_through[i]);
  if (f.evidence.propagated_through.size() > kShown)
    out.push_back(fmt::format("... and {} more (every one in the JSON report)",
                              f.evidence.propagated_through.size() - kShown));
  return out;
}

std::string digests_used(const DiffReport& r) {
  std::vector<std::string> names;
  for (const StreamSummary& s : r.streams)
    if (!s.digest.empty() && std::find(names.begin(), names.end(), s.digest) == names.end())
      names.push_back(s.digest);
  std::sort(names.begin(), names.end());
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::vector<std::pair<std::string, std::vector<std::string>>> ending_lines(const DiffReport& r) {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  const std::string recorded =
      r.verdict == Verdict::kIdentical
          ? fmt::format("what both runs recorded is identical ({} ops)", r.ops_compared)
      : r.verdict == Verdict::kIncomplete
          ? "what both runs recorded agrees, but part of it was not compared"
      : r.verdict == Verdict::kDivergent ? "what both runs recorded diverges: see below"
                                         : "what both runs recorded could not be judged";
  for (const RunEnding& e : r.endings) {
    std::string head = e.failed ? fmt::format("run {}'s program failed ({})", e.run,
                                              e.program.empty() ? "see run.json" : e.program)
                                : fmt::format(
                                      "run {}'s program ended ({}), but not every process exited",
                                      e.run, e.program.empty() ? "no run.json" : e.program);
    std::vector<std::string> lines;
    for (const ProcessEndingReport& p : e.processes) lines.push_back(p.detail);
    out.emplace_back(head + "; " + recorded, std::move(lines));
  }
  return out;
}

// What an "identical" rests on: the steps and ops compared, and the optimizer's writes among
// them, or under the sentinel the step states (parameters, gradients, optimizer state).
std::string what_was_compared(const DiffReport& r) {
  if (r.sentinel_runs)
    return fmt::format(
        "{} ops compared over {} step(s), bit for bit, with {} tensor(s) of step state "
        "(parameters, gradients, optimizer state)",
        r.ops_compared, r.steps_seen, r.parameters_tracked);
  return fmt::format("{} ops compared over {} step(s), bit for bit, {} of them optimizer ops",
                     r.ops_compared, r.steps_seen, r.optimizer_ops);
}

std::string outside_training(const DiffReport& r) {
  return fmt::format("{} op(s) outside training differ: {}", r.training.divergent_outside,
                     fmt::join(r.training.outside, ", "));
}

// "16 ulp", "rtol 1e-05, atol 0": the gate's tolerance as given.
static std::string tolerance_given(const GateConfig& g) {
  std::vector<std::string> parts;
  if (g.ulp > 0) parts.push_back(fmt::format("{:g} ulp", g.ulp));
  if (g.rtol > 0) parts.push_back(fmt::format("rtol {:g}", g.rtol));
  if (g.atol > 0) parts.push_back(fmt::format("atol {:g}", g.atol));
  return parts.empty() ? "none: bit for bit" : fmt::format("{}", fmt::join(parts, ", "));
}

std::string one_line_verdict(const DiffReport& r) {
  if (r.verdict == Verdict::kIncomplete)
    return fmt::format(
        "incomplete: {} ops compared, bit for bit, but {} part(s) of the runs were "
        "not compared (exit 5; --allow-truncated passes on what both runs have)",
        r.ops_compared, r.not_compared.size());
  if (r.verdict == Verdict::kIdentical && r.incomplete)
    return fmt::format(
        "identical up to the cut: {} ops compared, bit for bit, until a trace "
        "ended early (ops after the cut were not compared)",
        r.ops_compared);
  if (r.verdict == Verdict::kNoVerdict) return fmt::format("no verdict: {} (exit 8)", r.no_verdict);
  if (r.verdict == Verdict::kFailed)
    return fmt::format(
        "failed: the program failed in both runs (exit 4); of what they "
        "recorded, {} ops compared, {} divergent",
        r.ops_compared, r.divergent_ops);
  if (r.verdict == Verdict::kIdentical) return "identical: " + what_was_compared(r);
  if (r.verdict == Verdict::kDivergent && r.training.identical && r.gate.fail_on == "training")
    return fmt::format(
        "training identical: the {} training-state writes compared agree, and what differs "
        "reaches none of them ({}{})",
        r.training.writes_compared, outside_training(r),
        r.training.divergent_outside > r.training.outside.size() ? ", ..." : "");
  if (r.verdict == Verdict::kSameValues)
    return fmt::format(
        "identical values: {} place(s) ran other ops, each handing on the same bits, and the {} "
        "ops compared agree bit for bit; the first at rank {} step {} {} {}",
        r.structural_count, r.ops_compared, r.first->rank, r.first->step, r.first->phase,
        r.first->op);
  if (r.verdict == Verdict::kDivergent && r.gate.fail_on == "tolerance" && !r.beyond_tolerance)
    return fmt::format(
        "within tolerance: {} op(s) differ in their bits, none beyond the tolerance ({}); the "
        "first at rank {} step {} {} {}",
        r.divergent_ops + r.structural_count, tolerance_given(r.gate), r.first ? r.first->rank : 0,
        r.first ? r.first->step : 0, r.first ? r.first->phase : "", r.first ? r.first->op : "");
  if (r.verdict == Verdict::kUnexplained)
    return fmt::format(
        "unexplained: {} divergent ops, but detaudit could not name the first: {}. "
        "This is a detaudit bug (exit 6); please report it with both runs",
        r.divergent_ops, r.unexplained);
  if (!r.first) {
    for (const ReplicaCheck& c : r.replicas)
      if (c.divergence)
        return fmt::format(
            "divergent: replicas of {} disagree from step {}: rank {}'s parameter "
            "#{} (replica-divergence)",
            c.run_dir, c.divergence->step, c.divergence->rank, c.divergence->position);
    return "divergent";
  }
  if (const auto& n = r.numerics_change; n && r.gate.fail_on == "tolerance")
    return fmt::format(
        "beyond tolerance at rank {} step {} {} {}{}: {} moved {} (gate {})", n->rank, n->step,
        n->phase, n->op, n->replaced_by.empty() ? "" : " (" + n->replaced_by + " in run B)",
        n->tensor, deviation_text(n->output_relative, n->output_ulps), tolerance_given(r.gate));
  const FirstDivergence& f = *r.first;
  const bool beyond = r.gate.fail_on == "tolerance" && r.beyond_tolerance;
  return fmt::format(
      "{}: first at rank {} step {} {} {} ({}){}", beyond ? "beyond tolerance" : "divergent",
      f.rank, f.step, f.phase, f.op, f.divergence_class,
      r.training.identical ? "; outside training: the training state is identical" : "");
}

json remedy_verification_to_json(const RemedyVerification& v) {
  json rounds = json::array();
  for (const RemedyVerification::Round& k : v.rounds)
    rounds.push_back({{"round", k.round},
                      {"flags", k.flags},
                      {"runs", k.runs},
                      {"verdict", verdict_name(k.verdict)},
                      {"first_divergence", k.first.empty() ? json(nullptr) : json(k.first)}});
  return {{"verified", v.verified},
          {"outcome", v.outcome},
          {"flags", v.flags.empty() ? json(nullptr) : json(v.flags)},
          {"rounds", rounds}};
}

json selftest_to_json(const SelfTest& t) {
  json plants = json::array();
  for (const SelfTest::Plant& k : t.plants)
    plants.push_back({{"phase", k.phase},
                      {"kind", k.kind},
                      {"op", k.op},
                      {"stream", k.stream},
                      {"index", k.index},
                      {"step", k.step},
                      {"run", k.run},
                      {"value", k.value},
                      {"declared", k.declared},
                      {"before", k.before},
                      {"after", k.after},
                      {"outcome", k.outcome},
                      {"seen_at", k.seen_at.empty() ? json(nullptr) : json(k.seen_at)},
                      {"line", k.line}});
  return {{"passed", t.passed}, {"outcome", t.outcome}, {"plants", plants}, {"notes", t.notes}};
}

json validation_to_json(const Validation& v) {
  return {{"runs", v.runs},
          {"compared", v.compared},
          {"identical", v.identical},
          {"tensors", v.tensors},
          {"difference", v.difference.empty() ? json(nullptr) : json(v.difference)},
          {"hidden", v.hidden},
          {"sentinel", v.sentinel.empty() ? json(nullptr) : json(v.sentinel)},
          {"failed", v.failed},
          {"outcome", v.outcome}};
}

json report_to_json(const DiffReport& r) {
  json j;
  j["schema"] = "detaudit.diff/1";
  j["verdict"] = verdict_name(r.verdict);
  j["headline"] = gate_word(r);
  j["replicas"] = nlohmann::json::array();
  for (const ReplicaCheck& c : r.replicas) j["replicas"].push_back(replica_check_to_json(c));
  j["incomplete"] = r.incomplete;
  j["not_compared"] = r.not_compared;
  j["notes"] = r.notes;
  j["resumes"] = json::array();
  for (const ResumedProcess& rp : r.resumes)
    j["resumes"].push_back({{"run", rp.run == 0 ? "A" : "B"},
                            {"process", rp.process},
                            {"continues", rp.continues},
                            {"step", rp.step},
                            {"found_by", rp.found_by},
                            {"setup_ops", rp.setup_ops},
                            {"verified", rp.verified},
                            {"training_verified", rp.training_verified},
                            {"reordered_ops", rp.reordered_ops},
                            {"workers", rp.workers},
                            {"missing", rp.missing.empty() ? json(nullptr) : json(rp.missing)}});
  // Each run's world: its size, and the ranks or nodes missing from it (src/diff/world.h).
  json worlds = json::array();
  for (const WorldCheck& w : r.worlds)
    worlds.push_back({{"run", w.run},
                      {"world_size", w.world_size},
                      {"missing_ranks", w.missing},
                      {"unfinished_nodes", w.unfinished}});
  j["worlds"] = worlds;
  j["endings"] = json::array();
  for (const RunEnding& e : r.endings) {
    json processes = json::array();
    for (const ProcessEndingReport& p : e.processes) {
      json q = {{"process", p.process},
                {"rank", p.rank},
                {"ended", p.ended},
                {"detail", p.detail},
                {"thread", p.thread.empty() ? json(nullptr) : json(p.thread)},
                {"inside_op", p.inside_op.empty() ? json(nullptr) : json(p.inside_op)},
                {"after_last_recorded_op", p.recorded_ending && p.inside_op.empty()},
                {"while_exiting", p.exiting},
                {"streams_whole", p.streams_whole},
                {"last_op", nullptr}};
      if (!p.inside_op.empty()) q["inside_step"] = p.inside_step;
      if (p.any_op)
        q["last_op"] = {{"stream", p.last_stream},
                        {"op", p.last_op},
                        {"step", p.last_step},
                        {"index", p.last_index}};
      processes.push_back(std::move(q));
    }
    j["endings"].push_back({{"run", e.run == "A" ? "a" : "b"},
                            {"program", e.program.empty() ? json(nullptr) : json(e.program)},
                            {"failed", e.failed},
                            {"processes", processes}});
  }
  j["sentinel"] = nullptr;
  if (const auto& s = r.sentinel)
    j["sentinel"] = {{"runs", s->runs},
                     {"divergent", s->divergent},
                     {"step", s->divergent ? json(s->step) : json(nullptr)},
                     {"first", s->first.empty() ? json(nullptr) : json(s->first)},
                     {"tensors", s->tensors},
                     {"generator", s->generator.empty() ? json(nullptr) : json(s->generator)},
                     {"steps_divergent", s->steps_divergent},
                     {"full_runs", s->full_runs.empty() ? json(nullptr) : json(s->full_runs)},
                     {"full_steps", s->full_steps.empty() ? json(nullptr) : json(s->full_steps)},
                     {"came_back", s->came_back},
                     {"moved", s->moved},
                     {"note", s->note.empty() ? json(nullptr) : json(s->note)},
                     {"command", s->command.empty() ? json(nullptr) : json(s->command)},
                     {"catalog_ops", s->catalog_ops}};
  j["selftest"] = r.selftest ? selftest_to_json(*r.selftest) : json(nullptr);
  j["validation"] = r.validation ? validation_to_json(*r.validation) : json(nullptr);
  j["remedy_verification"] = nullptr;
  if (r.remedy_verification)
    j["remedy_verification"] = remedy_verification_to_json(*r.remedy_verification);
  j["library_threads"] = json::array();
  for (const PoolComparison& c : r.library_pools) {
    json p = {{"process", c.process},
              {"threads", c.pool->thread},
              {"streams_a", c.streams_a},
              {"streams_b", c.streams_b},
              {"ops_a", c.ops_a},
              {"ops_b", c.ops_b},
              {"matched", c.matched},
              {"unmatched_a", c.unmatched_a},
              {"unmatched_b", c.unmatched_b},
              {"why", c.pool->why}};
    if (c.unmatched_a || c.unmatched_b)
      p["first_unmatched"] = {{"step", c.first_unmatched_step}, {"op", c.first_unmatched_op}};
    j["library_threads"].push_back(std::move(p));
  }
  if (r.verdict == Verdict::kUnexplained) j["unexplained"] = r.unexplained;
  if (r.verdict == Verdict::kNoVerdict) j["no_verdict"] = r.no_verdict;
  j["compared"] = {{"ops", r.ops_compared},
                   {"steps", r.steps_seen},
                   {"optimizer_ops", r.optimizer_ops},
                   {"step_states", r.sentinel_runs ? json(r.parameters_tracked) : json(nullptr)}};
  j["exit_code"] = int(gate_exit_code(r));
  j["run_a"] = r.run_a;
  j["run_b"] = r.run_b;
  j["gate"] = {{"fail_on", r.gate.fail_on},
               {"rtol", r.gate.rtol},
               {"atol", r.gate.atol},
               {"ulp", r.gate.ulp},
               {"beyond_tolerance", r.beyond_tolerance},
               {"structure_tolerated", r.structure_tolerated},
               {"structure_matched", r.structure_matched},
               {"structure_same_bits", r.structure_same_bits}};
  if (const auto& n = r.numerics_change)
    j["numerics_change"] = {{"stream", n->stream},
                            {"rank", n->rank},
                            {"step", n->step},
                            {"phase", n->phase},
                            {"op", n->op},
                            {"replaced_by", n->replaced_by},
                            {"index", n->index},
                            {"output",
                             {{"tensor", n->tensor},
                              {"dtype", n->dtype},
                              {"relative", json_number(n->output_relative)},
                              {"ulps", json_number(n->output_ulps)}}},
                            {"input",
                             {{"tensor", n->input},
                              {"relative", json_number(n->input_relative)},
                              {"ulps", json_number(n->input_ulps)}}},
                            {"growth", growth_json(n->growth)}};
  else
    j["numerics_change"] = nullptr;
  json env = json::array();
  for (const EnvDifference& d : r.environment)
    env.push_back({{"process", d.process}, {"key", d.key}, {"a", d.a}, {"b", d.b}});
  j["environment_differences"] = env;

  if (r.first) {
    const FirstDivergence& f = *r.first;
    json fd{
        {"stream", f.stream},
        {"process", f.process},
        {"rank", f.rank},
        {"step", f.step},
        {"phase", f.phase},
        {"op", f.op},
        {"chain", f.chain},
        {"scope_path", f.scope_path},
        {"optimizer", f.optimizer_ordinal == 0 ? json(nullptr)
                                               : json{{"class", f.optimizer},
                                                      {"index", f.optimizer_ordinal},
                                                      {"of", f.optimizers},
                                                      {"tensors", f.optimizer_tensors},
                                                      {"text", stepping_optimizer(f)}}},
        {"kernel_origin", f.kernel_origin.empty() ? json(nullptr) : json(f.kernel_origin)},
        {"batch_read_by",
         f.evidence.batch_read_by.empty() ? json(nullptr) : json(f.evidence.batch_read_by)},
        {"received_through",
         f.evidence.received_through.empty() ? json(nullptr) : json(f.evidence.received_through)},
        {"propagated_through", f.evidence.propagated_through},
        {"scalar_argument",
         f.evidence.scalar_argument.empty() ? json(nullptr) : json(f.evidence.scalar_argument)},
        {"data_order", f.evidence.data_order},
        {"data_order_through_view", f.evidence.data_order_through_view},
        {"hash_seed_unset", f.evidence.hash_seed_unset},
        {"shared_writer",
         f.evidence.shared_writer.empty() ? json(nullptr) : json(f.evidence.shared_writer)},
        {"index", f.index},
        {"order", {{"a", f.order_a}, {"b", f.order_b}}},
        {"offset", {{"a", f.offset_a}, {"b", f.offset_b}}},
        {"class", divergence_class_name(f.divergence_class)},
        {"detail", f.evidence.detail},
        {"confirmed_by",
         f.evidence.confirmed_by.empty() ? json(nullptr) : json(f.evidence.confirmed_by)},
        {"args_differ", f.evidence.args_differ},
        {"random", f.evidence.is_random},
        {"cause", f.explanation.cause.empty() ? json(nullptr) : json(f.explanation.cause)},
        {"remedy", f.explanation.remedy},
        {"compiled_region",
         f.evidence.compiled_region.empty() ? json(nullptr) : json(f.evidence.compiled_region)},
        {"inputs", pairs_json(f.evidence.inputs)},
        {"outputs", pairs_json(f.evidence.outputs)},
        {"reaches_training",
         f.evidence.training.known ? json(f.evidence.training.reaches) : json(nullptr)}};
    if (f.evidence.is_random)
      fd["rng"] = {{"a", fmt::format("{:016x}", f.evidence.rng_a)},
                   {"b", fmt::format("{:016x}", f.evidence.rng_b)}};
    json mag = json::array();
    for (const StatsDelta& d : f.evidence.magnitude)
      mag.push_back({{"tensor", d.tensor},
                     {"has_stats", d.has_stats},
                     {"delta",
                      {{"min", json_number(d.min)},
                       {"max", json_number(d.max)},
                       {"mean", json_number(d.mean)},
                       {"l2", json_number(d.l2)},
                       {"nan", d.nan},
                       {"inf", d.inf}}},
                     {"max_abs", json_number(d.max_abs)},
                     {"relative", json_number(d.relative)},
                     {"ulps", json_number(d.ulps)},
                     {"within_tolerance", d.within_tolerance}});
    fd["magnitude"] = mag;
    if (f.explanation.catalog) {
      const CatalogRef& c = *f.explanation.catalog;
      fd["catalog"] = {{"id", c.id},
                       {"op", c.op},
                       {"condition", c.condition},
                       {"conditions_met", c.conditions_met},
                       {"conditions_unknown", c.conditions_unknown},
                       {"remedy", c.remedy},
                       {"uncertain", c.uncertain},
                       {"uncertainty", c.uncertainty},
                       {"sources", c.sources}};
    } else {
      fd["catalog"] = nullptr;
    }
    j["first_divergence"] = fd;
  } else {
    j["first_divergence"] = nullptr;
  }

  json st = json::array();
  for (const StructuralDifference& d : r.structural) {
    json values = nullptr;
    if (const auto& v = d.values)
      values = {{"handed_on", v->handed_on},
                {"exact", v->exact},
                {"within", v->within},
                {"beyond", v->beyond},
                {"unmatched", v->unmatched},
                {"matched", v->matched()},
                {"furthest",
                 {{"op", {{"a", v->op_a}, {"b", v->op_b}}},
                  {"dtype", v->dtype},
                  {"relative", json_number(v->relative)},
                  {"ulps", json_number(v->ulps)}}}};
    st.push_back({{"stream", d.stream},
                  {"step", d.step},
                  {"phase", d.phase},
                  {"index", {{"a", d.index_a}, {"b", d.index_b}}},
                  {"op", {{"a", d.op_a}, {"b", d.op_b}}},
                  {"skipped", {{"a", d.skipped_a}, {"b", d.skipped_b}}},
                  {"values", values},
                  {"detail", d.detail}});
  }
  j["structural_differences"] = {{"count", r.structural_count}, {"first", st}};

  json per_step = json::array();
  for (const auto& [step, n] : r.divergent_ops_per_step) {
    auto c = r.curve.find(step);
    per_step.push_back(
        {{"step", step},
         {"divergent_ops", n},
         {"max_relative_difference", c != r.curve.end() ? c->second.max_relative : 0.0}});
  }
  json loss = json::array();
  for (const auto& [rank, steps] : r.loss)
    for (const auto& [step, p] : steps)
      loss.push_back({{"rank", rank}, {"step", step}, {"a", p.a}, {"b", p.b}});
  json params = json::array();
  for (const ParameterDivergence& p : r.parameters)
    params.push_back({{"stream", p.stream},
                      {"position", p.position},
                      {"op", p.op},
                      {"first_step", p.first_step}});
  j["spread"] = {{"divergent_ops", r.divergent_ops},
                 {"per_step", per_step},
                 {"loss", loss},
                 {"parameters_tracked", r.parameters_tracked},
                 {"parameters_diverged", params}};
  j["training"] = {{"identical", r.training.identical},
                   {"writes_compared", r.training.writes_compared},
                   {"divergent_writes", r.training.divergent_writes},
                   {"divergent_outside", r.training.divergent_outside},
                   {"outside", r.training.outside}};

  if (r.truncated.empty()) {
    j["truncated"] = nullptr;
  } else {
    json t = json::array();
    for (const Truncation& x : r.truncated)
      t.push_back({{"run", x.run},
                   {"stream", x.stream},
                   {"file", x.file},
                   {"offset", x.offset},
                   {"ops_compared", x.ops_compared},
                   {"message", x.message}});
    j["truncated"] = {
        {"streams", t},
        {"note", "the comparison stopped at the cut; ops after it were not compared"}};
  }
  json unread = {{"count", r.unread_differences}, {"first", nullptr}};
  if (r.first_unread)
    unread["first"] = {{"stream", r.first_unread->stream},
                       {"step", r.first_unread->step},
                       {"op", r.first_unread->op},
                       {"index", r.first_unread->index},
                       {"overwritten_by", r.first_unread->overwritten_by}};
  j["unread_differences"] = unread;
  json streams = json::array();
  for (const StreamSummary& s : r.streams)
    streams.push_back({{"name", s.name},
                       {"digest", s.digest},
                       {"in_a", s.in_a},
                       {"in_b", s.in_b},
                       {"ops_a", s.ops_a},
                       {"ops_b", s.ops_b},
                       {"compared", s.compared},
                       {"divergent", s.divergent},
                       {"structural", s.structural},
                       {"unread", s.unread},
                       {"truncated", s.truncated},
                       {"alignment_lost", s.alignment_lost},
                       {"compiled_regions", s.compiled_regions},
                       {"compiled_kernels", s.compiled_kernels},
                       {"compiled_kernels_b", s.compiled_kernels_b},
                       {"consumer_last_step",
                        s.consumer_last_step ? json(*s.consumer_last_step) : json(nullptr)}});
  j["streams"] = streams;
  j["totals"] = {{"ops_compared", r.ops_compared},
                 {"records_a", r.records_a},
                 {"records_b", r.records_b},
                 {"bytes_read", r.bytes_read},
                 {"seconds", r.seconds}};
  return j;
}

}  // namespace detaudit
