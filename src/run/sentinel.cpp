#include "run/sentinel.h"

#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "catalog/catalog.h"
#include "diff/classify.h"
#include "diff/diff.h"
#include "diff/risk.h"
#include "diff/step_states.h"
#include "report/render.h"

namespace detaudit::run {
namespace {

// By how much: L2 in A and B, and their difference (often below the printed digits).
std::string l2_change(const TensorPair& t) {
  if (!t.a.has_stats || !t.b.has_stats) return "digest differs";
  return fmt::format("L2 {:.9g} vs {:.9g} (B - A = {:.3g})", t.a.stats.l2, t.b.stats.l2,
                     t.b.stats.l2 - t.a.stats.l2);
}

// The sentinel's first divergence, as the step-level finding says it.
void describe_first(const FirstDivergence& f, SentinelFinding* s) {
  s->step = f.step;
  s->first = fmt::format("{} {} ({})", f.stream, f.op, f.phase);
  for (const auto* side : {&f.evidence.inputs, &f.evidence.outputs})
    for (const TensorPair& t : *side)
      if (t.differs)
        s->tensors.push_back(fmt::format("{} {} {}: {}", t.label(), t.a.dtype,
                                         shape_string(t.a.sizes), l2_change(t)));
}

constexpr int kMaxRounds = 3;

// The earliest divergent step of a diff: its first op's, else its curve's (a sentinel diff may
// place no first op: a gradient bucket all-reduced across ranks, whose makers it did not record).
std::optional<uint64_t> earliest_step(const DiffReport& r) {
  if (r.first) return r.first->step;
  if (!r.curve.empty()) return r.curve.begin()->first;
  return std::nullopt;
}

// Both runs recorded again with steps `window` in full into `out`; their diff, or false with
// `why` set.
bool record_window(const SentinelPair& pair, const Catalog* catalog, const std::string& window,
                   const std::string& out, DiffReport* diff, std::vector<std::string>* dirs,
                   std::string* why) {
  dirs->clear();
  if (Status st = pair.record_in_full(window, out, dirs); !st.ok()) {
    *why = st.message();
    return false;
  }
  DiffOptions diff_options = pair.diff;
  diff_options.catalog = catalog;
  diff_options.progress = false;
  if (Status st = diff_runs((*dirs)[0], (*dirs)[1], diff_options, diff); !st.ok()) {
    *why = st.message();
    return false;
  }
  return true;
}

std::string window_of(uint64_t k) { return k == 0 ? "0" : fmt::format("{}-{}", k - 1, k); }

// The step the sentinel runs part at into `s`: the first op's, the curve's, or the step whose
// generator state differs first, if earlier. False when nothing parts them.
bool find_first_step(const DiffReport& report, SentinelFinding* s) {
  std::optional<uint64_t> step = earliest_step(report);
  std::optional<GeneratorDifference> rng;
  if (Status st = first_generator_difference(report.run_a, report.run_b, &rng); !st.ok())
    s->note = "the generators' states were not compared: " + st.message();
  if (rng) {
    s->generator = fmt::format(
        "{} generator state of {} first differs at step {} ({:016x} vs {:016x})", rng->generator,
        rng->stream, rng->step, rng->a, rng->b);
    s->divergent = true;
  }
  if (rng && (!step || rng->step < *step)) {
    // Drawn otherwise before any recorded tensor differs: the step before made the difference.
    s->step = rng->step;
    s->first = fmt::format("the {} generator's state ({})", rng->generator, rng->stream);
  } else if (!step) {
    return false;
  } else if (report.first) {
    describe_first(*report.first, s);
  } else {
    s->step = *step;
    s->first = fmt::format("none placed among {} differing op(s)",
                           report.curve.begin()->second.divergent_ops);
  }
  return true;
}

// Records step k and the one before in full, twice, until the runs part in that window (or
// later), kMaxRounds at most: the race may fire before the window in the runs that record it
// (the sentinel watches those steps too), and the window moves there. Returns the step the last
// window ends at, `full` their diff and whether the difference came back in it; nullopt when a
// recording failed (said in s.note).
std::optional<uint64_t> record_until_it_parts(const SentinelPair& pair, const Catalog* catalog,
                                              uint64_t k, SentinelFinding* s, DiffReport* full,
                                              std::vector<std::string>* dirs, bool* came_back) {
  for (int round = 1; round <= kMaxRounds; ++round) {
    s->full_steps = window_of(k);
    s->full_runs = (std::filesystem::path(pair.out) /
                    (round == 1 ? std::string("full") : fmt::format("full-{}", round)))
                       .string();
    fmt::print(stderr,
               "detaudit: sentinel: runs part at step {} ({}); recording step(s) {} in full, "
               "twice, in {}\n",
               k, s->first, s->full_steps, s->full_runs);
    std::string why;
    *full = DiffReport{};
    if (!record_window(pair, catalog, s->full_steps, s->full_runs, full, dirs, &why)) {
      s->note = fmt::format("the full recording of step(s) {} failed: {}", s->full_steps, why);
      return std::nullopt;
    }
    std::optional<uint64_t> at = earliest_step(*full);
    const uint64_t window_start = k == 0 ? 0 : k - 1;
    if (at && *at < window_start && round < kMaxRounds) {
      s->moved.push_back(
          fmt::format("recording steps {} in full, the runs parted earlier, at step {}: "
                      "recorded again there",
                      s->full_steps, *at));
      k = *at;
      continue;
    }
    // Parting only after the window (steps the sentinel alone watched there) is not the
    // difference coming back: the window's full records would not show its op.
    *came_back = at.has_value() && *at >= window_start && *at <= k;
    if (at && *at > k)
      s->moved.push_back(
          fmt::format("recording steps {} in full, the runs parted only after them, at step {}",
                      s->full_steps, *at));
    break;
  }
  return k;
}

// The op-level report of the full recording, with the whole run's step-level view from the
// sentinel's.
void keep_op_level_report(SentinelFinding s, DiffReport full, DiffReport* report) {
  full.curve = std::move(report->curve);
  full.loss = std::move(report->loss);
  full.parameters = std::move(report->parameters);
  full.parameters_tracked = report->parameters_tracked;
  full.divergent_ops = report->divergent_ops;
  full.divergent_ops_per_step = std::move(report->divergent_ops_per_step);
  full.notes.push_back(fmt::format(
      "sentinel: the spread, loss and parameters are the sentinel runs' ({}: every step, what "
      "the optimizer step read and left, and the loss); the first divergence is from step(s) {} "
      "recorded in full ({})",
      s.runs, s.full_steps, s.full_runs));
  full.sentinel = std::move(s);
  *report = std::move(full);
}

// The full recording agreed: the step-level finding stands, with the catalog ops that ran there.
void keep_step_level_finding(SentinelFinding s, const Catalog* catalog, const std::string& dir,
                             uint64_t from, DiffReport* report) {
  if (catalog) {
    RiskReport risk;
    if (risk_report(dir, *catalog, &risk).ok())
      for (const RiskHit& h : risk.hits)
        // The full diff saw no garbage read: the empty family is not what this is about.
        if (h.entry_id != "uninitialized-memory")
          s.catalog_ops.push_back(fmt::format("{} ({}, {} times from step {}): {}", h.op,
                                              h.entry_id, h.count, h.first_step, h.remedy));
  }
  const std::string remedy = fmt::format("record from step {} on: {}", from, s.command);
  report->sentinel = std::move(s);
  // Unexplained only for want of the ops a sentinel leaves out: the step is the finding, and
  // verdict_of says so from the finding.
  report->verdict = verdict_of(*report);
  if (report->verdict != Verdict::kUnexplained) report->unexplained.clear();
  if (!report->first) return;
  // What the sentinel's diff called the first divergence was made by ops it does not record:
  // its class and cause said so no better than "external". The step is what is known.
  FirstDivergence& f = *report->first;
  std::string which = "an output";
  for (const auto* side : {&f.evidence.inputs, &f.evidence.outputs})
    for (const TensorPair& t : *side)
      if (t.differs && which == "an output") which = t.label();
  classify_step_level(
      fmt::format("{} differs in the sentinel runs, not in the full recording", which), &f);
  f.explanation.cause = fmt::format(
      "step {}'s {} differs, made by ops the sentinel does not record; recorded in full, that "
      "step did not differ again",
      f.step, f.phase == "optimizer" ? "optimizer input or update" : "loss");
  f.explanation.remedy = remedy;
  f.explanation.catalog.reset();
}

}  // namespace

Status recorded_in_full(const Config& sentinel, const std::string& steps, Config* full) {
  *full = sentinel;
  RangeSet window;
  if (Status st = RangeSet::parse(nlohmann::json(steps), "record.full_steps", &window); !st.ok())
    return st;
  full->full_steps = window;
  if (!sentinel.digest_chosen && sentinel.digest == trace::DigestAlgo::kXxh3)
    full->digest = trace::DigestAlgo::kMd5;
  return Status();
}

SentinelPair sentinel_pair(const Config& config, const RunOptions& options) {
  SentinelPair pair;
  pair.out = config.out;
  pair.diff.gate = config.gate;
  pair.record_in_full = [config, options](const std::string& steps, const std::string& dir,
                                          std::vector<std::string>* dirs) {
    Config full;
    if (Status st = recorded_in_full(config, steps, &full); !st.ok()) return st;
    full.runs = 2;
    full.out = dir;
    RunOptions again = options;
    again.force = true;  // ours: inside --out, which this audit holds
    for (int i = 0; i < 2; ++i) {
      RunOutcome o;
      if (Status st = execute_run(full, again, i, &o); !st.ok()) return st;
      if (o.streams.empty()) return Status::error(fmt::format("run-{} recorded no trace", i));
      dirs->push_back(o.dir);
    }
    return Status();
  };
  pair.command_from = [config](uint64_t from) {
    std::string cmd = fmt::format("detaudit run --runs 2 --steps {}- --out {}", from,
                                  (std::filesystem::path(config.out) / "from-step").string());
    cmd += " --";
    for (const std::string& a : config.target.command) cmd += " " + a;
    return cmd;
  };
  return pair;
}

void localize_divergent_step(const SentinelPair& pair, const std::string& catalog_path,
                             DiffReport* report) {
  SentinelFinding s;
  s.runs = pair.out;
  s.steps_divergent = report->curve.size();
  s.divergent = report->verdict == Verdict::kDivergent || report->divergent_ops > 0;
  if (!find_first_step(*report, &s)) {
    report->sentinel = std::move(s);
    return;
  }
  Catalog catalog;
  const Catalog* known = Catalog::load(catalog_path, &catalog).ok() ? &catalog : nullptr;
  DiffReport full;
  std::vector<std::string> dirs;
  bool came_back = false;
  const std::optional<uint64_t> k = record_until_it_parts(pair, known, s.step, &s, &full, &dirs,
                                                          &came_back);
  if (!k) {
    report->sentinel = std::move(s);
    return;
  }
  const uint64_t from = *k > 0 ? *k - 1 : 0;
  s.command = pair.command_from(from);
  s.came_back = came_back;
  if (came_back) return keep_op_level_report(std::move(s), std::move(full), report);
  s.note = fmt::format(
      "recorded in full, step(s) {} were {}: what made step {} differ is rare or did not "
      "happen again at that step. The step-level finding stands; record from step {} on to "
      "catch it where it next happens",
      s.full_steps, full.verdict, *k, from);
  keep_step_level_finding(std::move(s), known, dirs.front(), from, report);
}

}  // namespace detaudit::run
