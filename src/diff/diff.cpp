// diff_runs: the comparison of two run directories as a pipeline of named phases, in the order
// the data flows (diff/phases.h); plus the verdict and the gate.
#include "diff/diff.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "diff/classify.h"
#include "diff/comparator.h"
#include "diff/endings.h"
#include "diff/environment.h"
#include "diff/first_divergence.h"
#include "diff/phases.h"
#include "diff/replicas.h"
#include "diff/report_model.h"
#include "diff/resume.h"
#include "diff/stream_selection.h"
#include "diff/world.h"
#include "trace/records.h"
#include "trace/run_directory.h"
#include "util/parallel.h"

namespace detaudit {

namespace {

// What comparing the streams gave: each stream's result, consumers' before their DataLoader
// workers', and each rank's folds for the replica check (run A's, run B's).
struct ComparedStreams {
  std::vector<StreamResult> results;
  std::vector<RankFolds> replica_folds[2];
};

// "r<rank>.main.t-main": a rank's main thread, whose updates the replica check folds.
bool rank_main_thread(const std::string& stream, const std::string& process) {
  return stream == process + ".t-main" && process.find('.') + 5 == process.size();
}

// The streams compared together, consumers or DataLoader workers, and each one's limits: a
// worker's stream up to the last step its consumer ran (`last_step`, by process: A, B).
void batch_of(const StreamSelection& selection, const DiffReport& r, bool workers,
              const std::map<std::string, std::pair<uint64_t, uint64_t>>& last_step,
              std::vector<std::string>* batch, std::vector<StreamLimits>* limits) {
  for (const auto& [name, head] : selection.heads) {
    if (head.dataloader_worker != workers) continue;
    StreamLimits l;
    l.world_lost_a = lost_world(r.worlds[0]);
    l.world_lost_b = lost_world(r.worlds[1]);
    if (auto w = selection.windows.find(name); w != selection.windows.end()) l.window = w->second;
    if (workers) {
      if (auto it = last_step.find(parent_process(head.process)); it != last_step.end()) {
        l.last_step_a = it->second.first;
        l.last_step_b = it->second.second;
      }
    }
    batch->push_back(name);
    limits->push_back(l);
  }
}

// Align and compare: every stream, one a core, in bounded memory. Consumers first: a worker's
// stream is compared up to the last step its consumer ran. Each rank's main thread is folded
// for the replica check as it is read: nothing is read twice.
Status compare_streams(const StreamSelection& selection, const Fingerprints& fingerprints_a,
                       const DiffOptions& options, const DiffReport& r, ComparedStreams* out) {
  // Not a structured binding: the lambdas below capture them (C++17 forbids that, clang says).
  const std::map<std::string, std::string>& sa = selection.streams[0];
  const std::map<std::string, std::string>& sb = selection.streams[1];
  ProgressFn progress;
  if (options.progress)
    progress = [](const std::string& stream, uint64_t done, uint64_t total) {
      fmt::print(stderr, "detaudit diff: {}: {:.0f}% ({} MB)\n", stream,
                 total ? 100.0 * double(done) / double(total) : 0.0, done >> 20);
    };
  std::map<std::string, std::pair<uint64_t, uint64_t>> last_step;  // by process: A, B
  for (bool workers : {false, true}) {
    std::vector<std::string> batch;
    std::vector<StreamLimits> limits;
    batch_of(selection, r, workers, last_step, &batch, &limits);
    std::vector<StreamResult> done(batch.size());
    std::vector<RankFolds> fold_a(batch.size()), fold_b(batch.size());
    std::vector<ReplicaFolder> folder_a, folder_b;
    for (size_t i = 0; i < batch.size(); ++i) {
      folder_a.emplace_back(&fold_a[i]);
      folder_b.emplace_back(&fold_b[i]);
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      const std::string& process = selection.heads.at(batch[i]).process;
      if (workers || !rank_main_thread(batch[i], process)) continue;
      limits[i].on_op_a = [f = &folder_a[i]](const trace::TraceReader& rd,
                                             const trace::OpRecord& op) { f->op(rd, op); };
      limits[i].on_op_b = [f = &folder_b[i]](const trace::TraceReader& rd,
                                             const trace::OpRecord& op) { f->op(rd, op); };
      for (auto [folds, streams] : {std::pair{&fold_a, &sa}, std::pair{&fold_b, &sb}}) {
        RankFolds& f = (*folds)[i];
        f.rank = trace::rank_of_name(process).value_or(-1);
        f.name = batch[i];
        auto it = streams->find(batch[i]);
        f.path = it == streams->end() ? "" : it->second;
      }
    }
    Status s = for_each_parallel(batch.size(), options.threads, [&](size_t i) {
      const std::string& name = batch[i];
      auto ia = sa.find(name), ib = sb.find(name);
      auto fingerprint = fingerprints_a.find(selection.heads.at(name).process);
      return ia != sa.end() && ib != sb.end()
                 ? compare_stream(
                       name, ia->second, ib->second, options, r.environment, progress, &done[i],
                       limits[i],
                       fingerprint != fingerprints_a.end() ? &fingerprint->second : nullptr)
                 : count_stream(name, ia != sa.end() ? ia->second : ib->second, ia != sa.end(),
                                &done[i], ia != sa.end() ? limits[i].on_op_a : limits[i].on_op_b);
    });
    if (!s.ok()) return s;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!limits[i].on_op_a) continue;
      if (!fold_a[i].path.empty()) out->replica_folds[0].push_back(std::move(fold_a[i]));
      if (!fold_b[i].path.empty()) out->replica_folds[1].push_back(std::move(fold_b[i]));
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      StreamResult& res = done[i];
      // A worker stream in one run only whose first batch is for a step its consumer never
      // ran: prefetched as timing allowed, not a difference of the program.
      if (workers && res.unpartnered_first_step) {
        const auto& limit = res.summary.in_a ? limits[i].last_step_a : limits[i].last_step_b;
        if (limit && *res.unpartnered_first_step > *limit) res.summary.consumer_last_step = *limit;
      }
      if (!workers) {
        auto [it, added] = last_step.try_emplace(selection.heads.at(batch[i]).process,
                                                 res.max_step_a, res.max_step_b);
        if (!added) {
          it->second.first = std::max(it->second.first, res.max_step_a);
          it->second.second = std::max(it->second.second, res.max_step_b);
        }
      }
      out->results.push_back(std::move(res));
    }
  }
  return Status();
}

bool has_base_key(const std::vector<EnvDifference>& env, const EnvDifference& d) {
  std::string base = d.key.substr(0, d.key.find(' '));
  for (const EnvDifference& e : env)
    if (e.process == d.process && e.key == base) return true;
  return false;
}

// Each stream's counts, differences and lines into the report; each result keeps only its
// `first`.
void add_stream_results(std::vector<StreamResult>* results, DiffReport* r) {
  for (StreamResult& res : *results)
    for (EnvDifference& d : res.step_settings)
      if (!has_base_key(r->environment, d)) r->environment.push_back(std::move(d));
  for (StreamResult& res : *results) {
    for (StructuralDifference& d : res.structural)
      if (r->structural.size() < kMaxStructural) r->structural.push_back(std::move(d));
    r->structural_count += res.structural_count;
    r->divergent_ops += res.divergent_ops;
    r->divergent_by_rank[res.rank];  // every rank gets a lane, divergent or not
    if (!res.divergent_orders.empty())
      r->divergent_orders[res.summary.name] = std::move(res.divergent_orders);
    for (const auto& [step, n] : res.per_step) {
      r->divergent_ops_per_step[step] += n;
      r->divergent_by_rank[res.rank][step] += n;
    }
    for (const auto& [step, p] : res.curve) {
      StepPoint& q = r->curve[step];
      q.divergent_ops += p.divergent_ops;
      q.max_relative = std::max(q.max_relative, p.max_relative);
    }
    // A rank's loss is its first stream's that has one: the main thread's, as a rule.
    if (!res.loss.empty() && !r->loss.count(res.rank)) r->loss[res.rank] = res.loss;
    for (ParameterDivergence& p : res.parameters) r->parameters.push_back(std::move(p));
    r->parameters_tracked += res.parameters_tracked;
    r->training.writes_compared += res.parameters_tracked;
    r->training.divergent_writes += res.divergent_training_writes;
    r->training.divergent_outside += res.divergent_outside;
    for (std::string& o : res.outside_training)
      if (r->training.outside.size() < TrainingCheck::kMaxOutside)
        r->training.outside.push_back(std::move(o));
    r->unread_differences += res.unread;
    if (!r->first_unread && res.first_unread) r->first_unread = std::move(res.first_unread);
    if (res.numerics_change) {
      res.numerics_change->rank = res.rank;
      keep_earliest_numerics_change(std::move(*res.numerics_change), r);
    }
    for (const Truncation& t : res.truncated)
      r->not_compared.push_back(
          fmt::format("run {} stream {} was cut short after {} compared ops "
                      "({})",
                      t.run == "a" ? "A" : "B", t.stream, t.ops_compared, t.message));
    if (res.truncated.empty() && (res.cut_a || res.cut_b))
      r->not_compared.push_back(
          fmt::format("stream {} has no END record in run {}: the process "
                      "did not end cleanly, so its last ops may be missing",
                      res.summary.name,
                      res.cut_a && res.cut_b ? "A nor B"
                      : res.cut_a            ? "A"
                                             : "B"));
    if ((!res.summary.in_a || !res.summary.in_b) && !res.summary.consumer_last_step)
      r->not_compared.push_back(fmt::format(
          "stream {} is only in run {} ({} ops not compared)", res.summary.name,
          res.summary.in_a ? "A" : "B", res.summary.in_a ? res.summary.ops_a : res.summary.ops_b));
    for (Truncation& t : res.truncated) r->truncated.push_back(std::move(t));
    r->beyond_tolerance = r->beyond_tolerance || res.beyond_tolerance;
    r->structure_tolerated = r->structure_tolerated || res.structure_tolerated;
    r->structure_matched += res.structure_matched;
    r->structure_same_bits += res.structure_same_bits;
    r->ops_compared += res.summary.compared;
    r->records_a += res.records_a;
    if (res.summary.in_a && res.summary.ops_a > 0) {
      r->steps_seen = std::max(r->steps_seen, res.max_step_a + 1);
      r->backward_passes = std::max(r->backward_passes, res.backward_passes_a);
      r->optimizer_ops += res.optimizer_ops_a;
    }
    r->records_b += res.records_b;
    r->bytes_read += res.bytes;
    r->streams.push_back(std::move(res.summary));
  }
}

// How each stream of each run ended, as the comparator read it: run A's, run B's.
std::vector<std::vector<StreamTail>> stream_tails(const std::vector<StreamResult>& results,
                                                  const StreamSelection& selection) {
  std::vector<std::vector<StreamTail>> tails(2);
  for (const StreamResult& res : results) {
    const std::string& process = selection.heads.at(res.summary.name).process;
    for (int side = 0; side < 2; ++side) {
      if (!(side == 0 ? res.summary.in_a : res.summary.in_b)) continue;
      const StreamResult::Tail& t = side == 0 ? res.tail_a : res.tail_b;
      tails[side].push_back({res.summary.name, process, res.rank, t.ended, t.any_op, t.last_op,
                             t.last_step, t.last_index, t.last_order});
    }
  }
  return tails;
}

// One line for all pools of a kind: how they were compared, and what matched.
void note_pools(DiffReport* r) {
  std::map<std::string, std::vector<const PoolComparison*>> by_pool;
  for (const PoolComparison& c : r->library_pools) by_pool[c.pool->thread].push_back(&c);
  for (const auto& [thread, pools] : by_pool) {
    uint64_t a = 0, b = 0, matched = 0, repeats = 0;
    std::vector<std::string> processes;
    for (const PoolComparison* c : pools) {
      a += c->ops_a;
      b += c->ops_b;
      matched += c->matched;
      repeats += c->setup_repeats;
      processes.push_back(c->process);
    }
    r->notes.push_back(fmt::format(
        "{} ({}): {}; their ops were compared as one set per process, not thread by thread: {} "
        "of {} in run A matched run B's {}{}",
        thread, fmt::join(processes, ", "), pools.front()->pool->why, matched, a, b,
        repeats ? fmt::format("; {} op(s) a resumed process ran again exactly as the process "
                              "before it had (its setup, building the model again: DDP "
                              "broadcasts the parameters) were not counted",
                              repeats)
                : ""));
  }
}

// The library pools' threads of each process, compared as one set of ops per process.
Status compare_library_pools(const trace::RunDirectory& run_a, const trace::RunDirectory& run_b,
                             StreamSelection* selection, DiffReport* r) {
  for (auto& [key, c] : selection->pools) {
    const auto& [pa, pb] = selection->pool_paths[key];
    // A process stopped by a signal, or one of a run that lost a node or rank, has run fewer
    // collectives, not others.
    c.truncated_a = lost_world(r->worlds[0]) || process_stopped_early(run_a, c.process);
    c.truncated_b = lost_world(r->worlds[1]) || process_stopped_early(run_b, c.process);
    c.truncated = c.truncated_a || c.truncated_b;
    if (Status s = compare_pool(pa, pb, &c); !s.ok()) return s;
    r->ops_compared += c.matched;
    r->divergent_ops += std::max(c.unmatched_a, c.unmatched_b);
    if (c.truncated)
      r->not_compared.push_back(fmt::format(
          "a {} thread of {} has no END record in run {}: the process did not end cleanly, so its "
          "last ops may be missing{}",
          c.pool->thread, c.process,
          c.truncated_a && c.truncated_b ? "A nor B"
          : c.truncated_a                ? "A"
                                         : "B",
          c.uncompared_a + c.uncompared_b ? fmt::format(" ({} of the other run's ops not compared)",
                                                        c.uncompared_a + c.uncompared_b)
                                          : ""));
    r->library_pools.push_back(std::move(c));
  }
  note_pools(r);
  return Status();
}

// Sentinel runs record a step's loss and optimizer updates, not the ops that made their inputs:
// "identical inputs, different outputs" is what they cannot see, not a finding.
void at_step_level(FirstDivergence* f) {
  const bool step_state = trace::is_step_state_record(f->op);
  // A step's state record reads gradients no record made: their difference is the finding.
  if (f->divergence_class != DivergenceClass::kNondeterministicOp &&
      f->divergence_class != DivergenceClass::kTorchBuild &&
      !(step_state && (f->divergence_class == DivergenceClass::kExternalInput ||
                       f->divergence_class == DivergenceClass::kInputDiffers)))
    return;
  const bool read_differs = std::any_of(f->evidence.inputs.begin(), f->evidence.inputs.end(),
                                        [](const TensorPair& p) { return p.differs; });
  const std::string finding =
      !step_state ? fmt::format("step {}'s {} differs", f->step,
                                f->phase == "optimizer" ? "optimizer input or update" : "loss")
      : read_differs
          ? fmt::format("step {}'s gradients differ (what its optimizer step read)", f->step)
          : fmt::format(
                "step {}'s optimizer update differs: the same gradients in, other "
                "parameters or state out",
                f->step);
  const std::string unseen =
      "both runs were recorded with --sentinel (each step's end only): the ops that made it "
      "were not recorded";
  // Another torch build stays the likeliest cause, named as before.
  f->explanation.cause = f->divergence_class == DivergenceClass::kTorchBuild
                             ? fmt::format("{}; {}", f->explanation.cause, unseen)
                             : fmt::format("{}; {}", finding, unseen);
  classify_step_level(finding, f);
  f->explanation.remedy = fmt::format(
      "record steps {}-{} of both in full (--steps {}-{}, without --sentinel) and diff them to "
      "find the op",
      f->step ? f->step - 1 : 0, f->step, f->step ? f->step - 1 : 0, f->step);
  f->explanation.catalog.reset();
}

}  // namespace

Status check_environment_and_world(const trace::RunDirectory& run_a,
                                   const trace::RunDirectory& run_b, DiffReport* r,
                                   Fingerprints fingerprints[2]) {
  if (Status s = check_recorded_alike(run_a, run_b, &r->sentinel_runs); !s.ok()) return s;
  if (Status s = load_environment(run_a, &fingerprints[0]); !s.ok()) return s;
  if (Status s = load_environment(run_b, &fingerprints[1]); !s.ok()) return s;
  r->environment = diff_environment(fingerprints[0], run_a.path(), fingerprints[1], run_b.path());
  if (std::string moved = placement_note(fingerprints[0], fingerprints[1]); !moved.empty())
    r->notes.push_back(moved);
  r->worlds.clear();
  for (int side = 0; side < 2; ++side) {
    WorldCheck w;
    w.run = side == 0 ? "A" : "B";
    if (Status s = check_world(side == 0 ? run_a : run_b, fingerprints[side], &w); !s.ok())
      return s;
    r->worlds.push_back(std::move(w));
  }
  return Status();
}

Status check_replicas_of_both(const trace::RunDirectory& run_a, const trace::RunDirectory& run_b,
                              std::vector<RankFolds> folds[2], bool part, DiffReport* r) {
  for (int side = 0; side < 2; ++side) {
    if (part) {  // the merge checks every part's folds
      r->replica_folds[side] = std::move(folds[side]);
      continue;
    }
    ReplicaCheck c;
    if (Status s = check_replicas_from(side == 0 ? run_a : run_b, std::move(folds[side]), &c);
        !s.ok())
      return s;
    r->beyond_tolerance = r->beyond_tolerance || c.divergence.has_value();  // bit for bit
    r->replicas.push_back(std::move(c));
  }
  return Status();
}

Status explain_first(const std::string* trace_a, const std::vector<EnvDifference>& environment,
                     FirstDivergence* first) {
  if (trace_a)
    if (Status s = find_roles(*trace_a, first); !s.ok()) return s;
  classify_under_torch_builds(environment, first);
  explain_cause(environment, first);
  return Status();
}

void note_training_identical(DiffReport* r) {
  // A resume's cause may say it already.
  if (!r->training.identical ||
      r->first->explanation.cause.find("training is the same") != std::string::npos)
    return;
  bool evaluation = false;
  for (const auto* side : {&r->first->evidence.inputs, &r->first->evidence.outputs})
    for (const TensorPair& p : *side)
      evaluation |= p.differs && p.tensor_role == TensorRole::kEvaluation;
  r->first->explanation.cause +=
      evaluation ? "; what differs is an evaluation's, computed with autograd off, "
                   "and reaches no parameter, gradient or optimizer state"
                 : "; what differs reaches no parameter, gradient or optimizer state";
}

void finish_report(const trace::RunDirectory& run_a, const trace::RunDirectory& run_b,
                   const std::vector<std::vector<StreamTail>>& tails, bool part, DiffReport* r) {
  if (!part)
    for (const WorldCheck& w : r->worlds)
      for (std::string& line : describe_world(w)) r->not_compared.push_back(std::move(line));
  r->endings = collect_endings({&run_a, &run_b}, tails);
  r->incomplete = !r->not_compared.empty();
  r->no_verdict = why_no_verdict(*r);
  r->verdict = verdict_of(*r);
  // Every op sequence difference left the values alone (ops only one run ran among them): the
  // first is one of them, and its cause says so.
  if (r->verdict == Verdict::kSameValues && r->first && !r->first->evidence.same_values) {
    r->first->evidence.same_values = true;
    explain_cause(r->environment, &*r->first);
  }
  r->training.identical = training_identical(*r);
}

Status diff_runs(const std::string& dir_a, const std::string& dir_b, const DiffOptions& options,
                 DiffReport* report) {
  const auto start = std::chrono::steady_clock::now();
  DiffReport r;
  r.run_a = dir_a;
  r.run_b = dir_b;
  r.gate = options.gate;
  trace::RunDirectory run_a, run_b;
  if (Status s = trace::RunDirectory::open(dir_a, &run_a); !s.ok()) return s;
  if (Status s = trace::RunDirectory::open(dir_b, &run_b); !s.ok()) return s;

  StreamSelection selection;
  if (Status s = select_streams(run_a, run_b, options.ranks, &selection); !s.ok()) return s;
  if (Status s = find_resumes(&selection, options.resume_step, &r.resumes, &r.notes); !s.ok())
    return s;
  Fingerprints fingerprints[2];
  if (Status s = check_environment_and_world(run_a, run_b, &r, fingerprints); !s.ok()) return s;
  ComparedStreams compared;
  if (Status s = compare_streams(selection, fingerprints[0], options, r, &compared); !s.ok())
    return s;
  note_resume_step_structure(r.resumes, compared.results, &r.notes);
  if (Status s = compare_library_pools(run_a, run_b, &selection, &r); !s.ok()) return s;
  note_fresh_layouts(compared.results, &r);
  const std::vector<std::vector<StreamTail>> tails = stream_tails(compared.results, selection);
  add_stream_results(&compared.results, &r);
  if (Status s = check_replicas_of_both(run_a, run_b, compared.replica_folds, options.part, &r);
      !s.ok())
    return s;

  std::vector<const FirstDivergence*> candidates;
  std::map<std::string, const FirstDivergence*> firsts;
  for (const StreamResult& res : compared.results)
    if (res.first) {
      candidates.push_back(&*res.first);
      firsts[res.first->stream] = &*res.first;
    }
  if (options.part)
    for (const FirstDivergence* c : candidates) r.candidates.push_back(*c);
  if (const FirstDivergence* first = choose_first(candidates, selection.heads)) {
    r.first = *first;
    add_spread(candidates, &*r.first);
    trace_origin(selection, firsts, &*r.first);
    auto path = selection.streams[0].find(r.first->stream);
    if (Status s = explain_first(path != selection.streams[0].end() ? &path->second : nullptr,
                                 r.environment, &*r.first);
        !s.ok())
      return s;
    if (r.sentinel_runs) at_step_level(&*r.first);
  }

  finish_report(run_a, run_b, tails, options.part, &r);
  explain_resumes(selection, &r);
  note_training_identical(&r);
  if (r.verdict == Verdict::kUnexplained)
    r.unexplained = why_no_first(candidates, r.divergent_ops, r.library_pools);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  *report = std::move(r);
  return Status();
}

namespace {
// A run whose program failed by itself: an exit status, or a crash inside an op. A process
// stopped from outside (a signal between ops: SIGKILL, the OOM killer, SIGTERM, torch's gloo
// teardown abort) is judged on what it recorded; a cut stream makes that incomplete.
bool failed_by_itself(const RunEnding& e) {
  if (!e.failed) return false;
  if (e.processes.empty()) return true;  // an exit status, not a crash
  for (const ProcessEndingReport& p : e.processes) {
    if (!p.recorded_ending) continue;  // SIGKILL: no chance to say how
    if (!p.inside_op.empty() ||
        (p.ended.rfind("killed by", 0) != 0 && p.ended.rfind("interrupted by", 0) != 0))
      return true;
  }
  return false;
}
}  // namespace

Verdict verdict_of(const DiffReport& r) {
  bool replicas_disagree = false;
  for (const ReplicaCheck& c : r.replicas) replicas_disagree |= c.divergence.has_value();
  // A sentinel pair whose steps part, where the ops that made the step were not recorded: the
  // step is the finding (run/sentinel.h).
  const bool sentinel_parted = r.sentinel && r.sentinel->divergent;
  // Other ops in places, each handing on the same bits, and every op compared the same bits: a
  // refactor computed what the other run did (the regions are listed, the gate passes).
  const bool same_values = r.divergent_ops == 0 && r.structural_count > 0 &&
                           r.structure_same_bits == r.structural_count && r.first;
  if (same_values && !replicas_disagree && !sentinel_parted)
    return r.incomplete && !r.gate.allow_truncated ? Verdict::kIncomplete : Verdict::kSameValues;
  if (r.divergent_ops > 0 || r.structural_count > 0 || replicas_disagree || sentinel_parted)
    // A divergence the report cannot place is no verdict a user can act on: the tool failed.
    return r.first || replicas_disagree || sentinel_parted ? Verdict::kDivergent
                                                           : Verdict::kUnexplained;
  if (r.incomplete && !r.gate.allow_truncated) return Verdict::kIncomplete;
  // No run to judge the program by: however alike their recordings, the pair failed.
  std::set<std::string> failed;
  for (const RunEnding& e : r.endings)
    if (failed_by_itself(e)) failed.insert(e.run);
  if (failed.size() == 2) return Verdict::kFailed;
  return r.no_verdict.empty() ? Verdict::kIdentical : Verdict::kNoVerdict;
}

bool training_identical(const DiffReport& r) {
  bool replicas_disagree = false;
  for (const ReplicaCheck& c : r.replicas) replicas_disagree |= c.divergence.has_value();
  const TrainingCheck& t = r.training;
  return r.verdict == Verdict::kDivergent && r.first && r.first->evidence.training.known &&
         !r.first->evidence.training.reaches && t.writes_compared > 0 && t.divergent_writes == 0 &&
         r.parameters.empty() && r.structural_count == 0 && !replicas_disagree;
}

std::string why_no_verdict(const DiffReport& r) {
  if (r.ops_compared == 0)
    return "nothing was compared: neither run recorded an op both have (check --steps and "
           "that the program ran torch ops)";
  if (r.sentinel_runs && r.parameters_tracked == 0)
    return "the sentinel compared no step state: no optimizer step wrote a tensor it saw "
           "(record in full, without --sentinel)";
  if (r.backward_passes >= 2 && r.optimizer_ops == 0 && r.steps_seen <= 1)
    return fmt::format(
        "the program trained ({} backward passes) but no optimizer step was seen, so every op "
        "counts as step 0: step a torch.optim optimizer, or mark each step's end with "
        "torch.profiler.record_function(\"detaudit::step\") (C++: detaudit/marker.h)",
        r.backward_passes);
  return "";
}

std::string gate_word(const DiffReport& r) {
  switch (r.verdict) {
    case Verdict::kSameValues: return "identical values (other ops)";
    case Verdict::kDivergent:
      if (r.gate.fail_on == "training" && r.training.identical) return "training identical";
      if (r.gate.fail_on == "tolerance")
        return r.beyond_tolerance ? "beyond tolerance" : "within tolerance";
      return "divergent";
    case Verdict::kNoVerdict: return "no verdict";
    default: return verdict_name(r.verdict);
  }
}

ExitCode gate_exit_code(const DiffReport& report) {
  if (report.verdict == Verdict::kUnexplained) return ExitCode::kUnexplained;
  // A self-test that did not find its plant: nothing this audit says can be trusted.
  if (report.selftest && !report.selftest->passed) return ExitCode::kUnexplained;
  if (report.validation && report.validation->failed) return ExitCode::kUnexplained;
  if (report.verdict == Verdict::kFailed) return ExitCode::kTargetFailed;
  if (report.verdict == Verdict::kNoVerdict) return ExitCode::kNoVerdict;
  const bool fails = report.verdict == Verdict::kDivergent &&
                     !(report.gate.fail_on == "tolerance" && !report.beyond_tolerance) &&
                     !(report.gate.fail_on == "training" && report.training.identical);
  if (fails) return ExitCode::kDivergent;
  // Fail closed: what was not compared cannot pass, unless the gate allows it.
  if (report.incomplete && !report.gate.allow_truncated) return ExitCode::kIncomplete;
  return ExitCode::kIdentical;
}

}  // namespace detaudit
