// The per-stream comparison loop: lockstep while keys match, resynchronise when they do not,
// track the first divergence with its chain of enclosing ops, and count the spread.
#include "diff/comparator.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <mutex>
#include <thread>

#include "diff/aligner.h"
#include "diff/classify.h"
#include "diff/differing_versions.h"
#include "diff/op_source.h"
#include "diff/region_values.h"
#include "run_layout.h"
#include "trace/process_status.h"
#include "trace/records.h"

namespace detaudit {
namespace {

using trace::ReadResult;

bool ends_with_underscore(std::string_view s) { return !s.empty() && s.back() == '_'; }

// How a side of a stream ended: its END record and its last op.
StreamResult::Tail tail_of(const OpSource& s) {
  StreamResult::Tail t;
  t.ended = s.reader().saw_end();
  t.end = s.reader().end_info();
  t.any_op = s.ops_read() > 0;
  if (t.any_op) {
    t.last_op = std::string(s.reader().string(s.last_op().name));
    t.last_step = s.last_op().step;
    t.last_index = s.last_op().index;
    t.last_order = s.last_op().order;
  }
  return t;
}

// Fills both runs' look-ahead buffers at once, run B's on a helper thread: reading and decoding
// are nine tenths of a diff's work. The comparator touches neither side while a fill runs.
class PairFiller {
 public:
  PairFiller(OpSource* a, OpSource* b) : a_(a), b_(b), worker_([this] { serve(); }) {}
  ~PairFiller() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  void fill(size_t n) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      want_ = n;
      pending_ = true;
    }
    cv_.notify_all();
    a_->fill(n);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !pending_; });
  }

 private:
  void serve() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return pending_ || quit_; });
      if (quit_) return;
      const size_t n = want_;
      lock.unlock();
      b_->fill(n);
      lock.lock();
      pending_ = false;
      cv_.notify_all();
    }
  }

  OpSource* a_;
  OpSource* b_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t want_ = 0;
  bool pending_ = false, quit_ = false;
  std::thread worker_;  // last: starts once the rest is initialised
};

class StreamComparator {
 public:
  StreamComparator(const std::string& name, const DiffOptions& options,
                   const std::vector<EnvDifference>& env, const ProgressFn& progress,
                   StreamResult* out, const StreamLimits& limits,
                   const std::map<std::string, std::string>* fingerprint_a)
      : name_(name),
        options_(options),
        env_(env),
        progress_(progress),
        out_(out),
        limits_(limits),
        fingerprint_a_(fingerprint_a) {}

  Status run(const std::string& path_a, const std::string& path_b) {
    trace::TraceReader ra, rb;
    if (Status s = ra.open(path_a); !s.ok()) return s;
    if (Status s = rb.open(path_b); !s.ok()) return s;
    // Digests of two algorithms never match: comparing them would report every tensor.
    if (ra.header().algo != rb.header().algo)
      return Status::error(
          fmt::format("{}: recorded with the {} digest, {} with the {} digest: they cannot be "
                      "compared; record both runs with the same --digest",
                      path_a, trace::digest_name(ra.header().algo), path_b,
                      trace::digest_name(rb.header().algo)),
          ExitCode::kBadInput);
    out_->summary.digest = std::string(trace::digest_name(ra.header().algo));
    out_->rank = ra.header().rank;
    process_ = layout_process(ra);
    OpSource a(&ra), b(&rb);
    a.tap(limits_.on_op_a);
    b.tap(limits_.on_op_b);
    const StreamWindow& w = limits_.window;
    a.window(w.first_step[0], w.skip[0], w.step_shift[0]);
    b.window(w.first_step[1], w.skip[1], w.step_shift[1]);
    if (w.until_step) {
      a.stop_after_step(*w.until_step);
      b.stop_after_step(*w.until_step);
    }
    if (limits_.last_step_a) a.stop_after_step(*limits_.last_step_a);
    if (limits_.last_step_b) b.stop_after_step(*limits_.last_step_b);
    if (limits_.last_step_a || limits_.last_step_b)
      out_->summary.consumer_last_step = std::max(limits_.last_step_a.value_or(0),
                                                  limits_.last_step_b.value_or(0));
    a_ = &a;
    b_ = &b;
    total_bytes_ = ra.file_size() + rb.file_size();
    pair_ops(ra, rb, a, b);
    // The loop stops at the first side to end; read the other up to its next op or its end.
    a.fill(1);
    b.fill(1);
    // Still open at the end: the program may read it after the stream, so it counts.
    confirm_open("not overwritten before the stream ended");
    settle(/*at_end=*/true);
    if (out_->first) {
      out_->first->collectives_before = collectives_before_;
      out_->first->collectives_after = collectives_after_;
    }
    Status s = finish(ra, rb);
    if (!out_->first && same_values_first_) out_->first = std::move(same_values_first_);
    note_what_run_a_showed(a);
    out_->max_step_b = b.max_step();
    out_->tail_b = tail_of(b);
    return s;
  }

  // Ops pair up in order; a pair whose keys differ is realigned (resync).
  void pair_ops(const trace::TraceReader& ra, const trace::TraceReader& rb, OpSource& a,
                OpSource& b) {
    auto last = std::chrono::steady_clock::now();
    PairFiller filler(&a, &b);

    // A collective at the head whose receive buffers are not read yet: read on once for them.
    auto awaiting = [](const OpSource& s) {
      return s.at(0).collective && !s.at(0).received && !s.exhausted();
    };
    uint64_t refilled_for = UINT64_MAX;
    for (uint64_t n = 0;; ++n) {
      if (a.size() == 0 || b.size() == 0) {
        filler.fill(OpSource::kCapacity);
      } else if ((awaiting(a) || awaiting(b)) && refilled_for != a.at(0).index) {
        refilled_for = a.at(0).index;
        filler.fill(OpSource::kCapacity);
      }
      if (a.size() == 0 || b.size() == 0) break;
      if (a.at(0).key == b.at(0).key) {
        compare_pair(a.at(0), b.at(0));
        a.pop();
        b.pop();
      } else {
        resync();
      }
      if (progress_ && (n & 0xfffff) == 0) {
        auto now = std::chrono::steady_clock::now();
        if (now - last > std::chrono::seconds(1)) {
          last = now;
          progress_(name_, ra.bytes_read() + rb.bytes_read(), total_bytes_);
        }
      }
    }
  }

  // What run A's stream showed of its training: its steps, backward passes and optimizer ops,
  // the optimizer whose step the first divergence is in, and how it ended.
  void note_what_run_a_showed(OpSource& a) {
    out_->max_step_a = a.max_step();
    out_->backward_passes_a = a.backward_passes();
    out_->optimizer_ops_a = a.optimizer_ops();
    if (out_->first)
      if (const trace::OptimizerStepLabel* o = a.optimizer_of_step(out_->first->step)) {
        out_->first->optimizer_ordinal = a.place_among_optimizers(o->ordinal);
        out_->first->optimizers = a.optimizers();
        out_->first->optimizer = o->optimizer;
        out_->first->optimizer_tensors = o->tensors;
      }
    out_->tail_a = tail_of(a);
  }

 private:
  static std::string layout_process(const trace::TraceReader& r) {
    return layout::process_name(r.header().rank, r.header().process_role);
  }

  OpFacts facts(const BufferedOp& op, const OpSource& s) const {
    OpFacts f;
    f.name = s.name_of(op.rec);
    f.op = &op.rec;
    f.reader = &s.reader();
    if (const trace::StepInfo* st = s.step_info(op.rec.step))
      f.intra_op_threads = st->intra_op_threads;
    f.fingerprint = fingerprint_a_;
    return f;
  }

  // An op whose outputs differ, counted once the difference it belongs to is a divergence.
  struct DivergentOp {
    uint64_t step = 0, order = 0;
    double relative = 0;
    bool beyond_tolerance = false;
    std::vector<uint64_t> parameters;  // the positions of the parameters it wrote that differ
    std::string name;
    bool writes_training = false;  // roles.h's writes_training_state
  };

  // A candidate first divergence (or a structural one), open until the program reads what
  // differs, or until every differing version is overwritten unread (differing_versions.h).
  struct Candidate {
    FirstDivergence fd;
    int64_t need_depth = -1;            // the enclosing op still to come; -1: its chain is complete
    std::vector<std::string> rejected;  // catalog entries an inner op of the chain did not meet
    DifferingVersions a, b;
    bool confirmed = false;
    std::string overwritten_by;
    std::vector<DivergentOp> ops;
  };

  // At a resumed stream's resume step, a collective whose differing outputs hold the same values
  // in another order: a buffer a fresh process laid out anew (DDP fills its gradient buckets in
  // parameter order in its first iteration), counted apart (StreamResult::reordered_at_resume).
  // Only a collective's: a permutation drawn anew (randperm) or a batch in another order holds
  // the same values in another order too, and is what a checkpoint missed.
  bool laid_out_anew(const BufferedOp& a, const BufferedOp& b) {
    const StreamWindow& w = limits_.window;
    size_t i = 0;
    if (!w.resume_step || a.rec.step != *w.resume_step || !a.collective || a.rec.is_random() ||
        !outputs_reordered(a.rec, a_->reader(), b.rec, b_->reader(), &i))
      return false;
    if (out_->reordered_at_resume++ == 0) {
      const trace::TensorDesc& ta = *a_->reader().tensor(a.rec.output_tensors[i]);
      const trace::TensorDesc& tb = *b_->reader().tensor(b.rec.output_tensors[i]);
      out_->first_reordered = fmt::format(
          "{} (output {}: {} {} values, equal min, max, mean and l2; digests {} and {})",
          a_->name_of(a.rec), i, ta.numel(), trace::dtype_name(ta.dtype),
          ta.digest_hex().substr(0, 12), tb.digest_hex().substr(0, 12));
    }
    return true;
  }

  void compare_pair(const BufferedOp& a, const BufferedOp& b) {
    const trace::TraceReader& ra = a_->reader();
    const trace::TraceReader& rb = b_->reader();
    ++out_->summary.compared;
    bool differ = !a.outputs.same_as(b.outputs) && outputs_differ(a.rec, ra, b.rec, rb);
    if (differ && laid_out_anew(a, b)) differ = false;
    std::vector<uint64_t> parameters = parameter_positions(a, b, differ);
    track_loss(a, b);
    std::optional<DivergentOp> op;
    if (differ) {
      op.emplace();
      op->step = a.rec.step;
      op->order = a.rec.order;
      op->relative = largest_relative_difference(a.rec, ra, b.rec, rb);
      op->beyond_tolerance = !output_deltas(a.rec, ra, b.rec, rb, options_.gate, nullptr);
      if (op->beyond_tolerance) note_numerics_change(a, b);
      op->parameters = std::move(parameters);
      op->name = std::string(a_->name_of(a.rec));
      op->writes_training = writes_training_state(a.rec);
      note_growth(a, *op);
    }
    if (first_done_) {
      if (op) count(*op);
      track_collective(a);
      return;
    }
    if (open_.empty() && !differ) remember_outputs(a, b);

    // A read of a differing version confirms its candidate; the first reader is the evidence.
    Candidate* read_from = nullptr;
    for (Candidate& c : open_) {
      if (!reads_differing_bytes(c, a.rec, ra, b.rec, rb)) continue;
      if (!c.confirmed)
        c.fd.evidence.confirmed_by = fmt::format("read by {} (op #{}, step {})", a_->name_of(a.rec),
                                                 a.index, a.rec.step);
      c.confirmed = true;
      if (!read_from) read_from = &c;
    }
    // The ops that enclose a candidate end after it: its chain, and its differing outputs.
    Candidate* enclosed = nullptr;
    for (Candidate& c : open_) {
      if (c.need_depth < 0 || int64_t(a.rec.depth) != c.need_depth) continue;
      c.fd.chain.insert(c.fd.chain.begin(), std::string(a_->name_of(a.rec)));
      if (!c.fd.explanation.catalog && c.fd.divergence_class != DivergenceClass::kStructural &&
          !c.fd.evidence.arose_in_compiled_region && !c.fd.evidence.data_order)
        c.fd.explanation.catalog = catalog_ref(options_.catalog, facts(a, *a_), &c.rejected);
      --c.need_depth;
      if (differ) track_outputs(a, b, &c, /*enclosing=*/true);
      if (!enclosed) enclosed = &c;
    }
    for (Candidate& c : open_) {
      const bool forgot_a = c.a.forget_written(a.rec, ra);
      const bool forgot_b = c.b.forget_written(b.rec, rb);
      if ((forgot_a || forgot_b) && c.a.empty() && c.b.empty())
        c.overwritten_by = fmt::format("{} (op #{})", a_->name_of(a.rec), a.index);
    }
    if (op) {
      if (Candidate* owner = enclosed ? enclosed : read_from) {
        owner->ops.push_back(std::move(*op));
      } else {
        open_candidate(a, b, std::move(*op));
      }
    }
    if (a.collective && a.received)
      collectives_open_.push_back({a.index, a.coll.group, a.coll.seq});
    // A top-level op encloses nothing further: chains end there (filters may hide some ops).
    if (a.rec.depth == 0)
      for (Candidate& c : open_) c.need_depth = -1;
    for (Candidate& c : open_)
      if (!c.confirmed && (!c.a.in_reach(ra) || !c.b.in_reach(rb)))
        confirm(&c, "out of the trace's reference window before any read or overwrite");
    if (open_.size() > kMaxOpen) confirm(&open_.front(), "too many differences open at once");
    settle(/*at_end=*/false);
  }

  // An input that is (a view of) a differing version, unless what the op read there hashed
  // the same in both runs: a view of an identical slot of a buffer that differs elsewhere.
  static bool reads_differing_bytes(const Candidate& c, const trace::OpRecord& a,
                                    const trace::TraceReader& ra, const trace::OpRecord& b,
                                    const trace::TraceReader& rb) {
    const size_t n = std::max(a.input_tensors.size(), b.input_tensors.size());
    for (size_t i = 0; i < n; ++i) {
      const trace::TensorDesc* ta = i < a.input_tensors.size() ? ra.tensor(a.input_tensors[i])
                                                               : nullptr;
      const trace::TensorDesc* tb = i < b.input_tensors.size() ? rb.tensor(b.input_tensors[i])
                                                               : nullptr;
      // Unlinked, but the differing bytes themselves in both runs: read.
      if (ta && tb && !a.input_written(i) && !ta->not_read() && c.a.same_bytes_as_one(*ta, ra) &&
          c.b.same_bytes_as_one(*tb, rb))
        return true;
      if (!c.a.read_at(a, i, ra) && !c.b.read_at(b, i, rb)) continue;
      const bool same_bytes = ta && tb && ta->has_contents() && tb->has_contents() &&
                              ta->dtype == tb->dtype && ta->sizes == tb->sizes &&
                              ta->same_digest(*tb);
      if (!same_bytes) return true;
    }
    return false;
  }

  void open_candidate(const BufferedOp& a, const BufferedOp& b, DivergentOp op) {
    Candidate& c = open_.emplace_back();
    FirstDivergence& fd = c.fd;
    fd.stream = name_;
    fd.process = process_;
    fd.rank = out_->rank;
    classify_divergence(a, *a_, b, *b_, options_.gate, &fd, &seen_);
    if (fd.evidence.data_order && fingerprint_a_) {
      auto seed = fingerprint_a_->find("env.PYTHONHASHSEED");
      auto python = fingerprint_a_->find("python");
      fd.evidence.hash_seed_unset = seed != fingerprint_a_->end() && seed->second == "null" &&
                                    python != fingerprint_a_->end() && python->second == "true";
    }
    if (a.rec.scope_path != UINT32_MAX)
      fd.scope_path = trace::without_optimizer_step_label(a_->reader().string(a.rec.scope_path));
    fd.kernel_origin = kernel_origin(a.rec, a_->reader());
    fd.chain = {fd.op};
    // Not the op that read the region's output, nor one handed other tensors: the catalog
    // would explain the wrong kernel.
    if (!fd.evidence.arose_in_compiled_region && !fd.evidence.data_order)
      fd.explanation.catalog = catalog_ref(options_.catalog, facts(a, *a_), &c.rejected);
    c.need_depth = int64_t(a.rec.depth) - 1;
    track_outputs(a, b, &c);
    // A differing scalar return went to Python: read there.
    if (c.a.empty() && c.b.empty()) confirm(&c, "returned to Python (a scalar)");
    c.ops.push_back(std::move(op));
  }

  // The differing tensor outputs, one set per run.
  void track_outputs(const BufferedOp& a, const BufferedOp& b, Candidate* c,
                     bool enclosing = false) {
    const auto& oa = a.rec.output_tensors;
    const auto& ob = b.rec.output_tensors;
    for (size_t i = 0; i < std::min(oa.size(), ob.size()); ++i) {
      const trace::TensorDesc* ta = a_->reader().tensor(oa[i]);
      const trace::TensorDesc* tb = b_->reader().tensor(ob[i]);
      if (!ta || !tb || !ta->has_contents() || !tb->has_contents() || ta->same_digest(*tb))
        continue;
      if (enclosing) {
        c->a.add_enclosing_output(oa[i], a_->reader());
        c->b.add_enclosing_output(ob[i], b_->reader());
      } else {
        c->a.add(oa[i]);
        c->b.add(ob[i]);
      }
    }
  }

  void confirm(Candidate* c, const char* why) {
    if (c->confirmed) return;
    c->confirmed = true;
    c->fd.evidence.confirmed_by = why;
  }
  void confirm_open(const char* why) {
    for (Candidate& c : open_)
      if (c.overwritten_by.empty()) confirm(&c, why);
  }

  static bool unread(const Candidate& c) { return !c.confirmed && c.a.empty() && c.b.empty(); }

  // Resolves open candidates in order: an overwritten one is dropped, a confirmed one whose
  // chain is complete is the first divergence, and every later difference counts.
  void settle(bool at_end) {
    while (!open_.empty()) {
      Candidate& c = open_.front();
      if (unread(c)) {
        ++out_->unread;
        ++out_->summary.unread;
        if (!out_->first_unread)
          out_->first_unread = UnreadDifference{name_, c.fd.step, c.fd.op, c.fd.index,
                                                c.overwritten_by};
        fold_collectives(open_.size() > 1 ? open_[1].fd.index : UINT64_MAX);
        open_.pop_front();
        continue;
      }
      if (!c.confirmed || (c.need_depth >= 0 && !at_end)) return;
      out_->first = std::move(c.fd);
      first_done_ = true;
      fold_collectives(out_->first->index);
      // Its own ops first: a parameter's first divergent step is the earliest one counted.
      for (const DivergentOp& op : open_.front().ops) count(op);
      // Later candidates count as spread, unless they were overwritten unread.
      for (size_t i = 1; i < open_.size(); ++i) {
        if (unread(open_[i])) {
          ++out_->unread;
          ++out_->summary.unread;
          continue;
        }
        for (const DivergentOp& op : open_[i].ops) count(op);
      }
      open_.clear();
      return;
    }
    fold_collectives(UINT64_MAX);
  }

  // Collectives seen while candidates were open. Before the first divergence is known, those
  // before op `index` are settled; once it is, a collective at the first op itself is both its
  // last before and its first after (FirstDivergence::collectives_before).
  void fold_collectives(uint64_t index) {
    size_t kept = 0;
    for (const SeenCollective& c : collectives_open_) {
      const bool before = first_done_ ? c.index <= index : c.index < index;
      if (before) collectives_before_[c.group] = c.seq;
      if (first_done_ && c.index >= index) collectives_after_.emplace(c.group, c.seq);
      if (!before && !first_done_) collectives_open_[kept++] = c;
    }
    collectives_open_.resize(kept);
  }

  // The first op beyond the tolerance whose inputs are all within it (NumericsChange).
  void note_numerics_change(const BufferedOp& a, const BufferedOp& b) {
    if (out_->numerics_change || options_.gate.fail_on != "tolerance") return;
    const trace::TraceReader& ra = a_->reader();
    const trace::TraceReader& rb = b_->reader();
    const Deviation in = tensors_deviation(a.rec.input_tensors, ra, b.rec.input_tensors, rb,
                                           options_.gate, "input");
    if (!in.within) return;
    const Deviation out = tensors_deviation(a.rec.output_tensors, ra, b.rec.output_tensors, rb,
                                            options_.gate, "output");
    NumericsChange& n = out_->numerics_change.emplace();
    n.stream = name_;
    n.step = a.rec.step;
    n.index = a.index;
    n.phase = std::string(trace::phase_name(a.rec.phase));
    n.op = std::string(a_->name_of(a.rec));
    n.tensor = out.tensor;
    n.dtype = out.dtype;
    n.output_relative = out.relative;
    n.output_ulps = out.ulps;
    n.input = in.tensor;
    n.input_relative = in.relative;
    n.input_ulps = in.ulps;
  }

  // The numerics change's step, op by op after it: how far each divergent op's outputs moved.
  void note_growth(const BufferedOp& a, const DivergentOp& op) {
    auto& n = out_->numerics_change;
    if (!n || op.step != n->step || n->growth.size() >= NumericsChange::kMaxGrowth) return;
    n->growth.push_back(
        {a.index, op.name, std::string(trace::phase_name(a.rec.phase)), op.relative});
  }

  // A replaced region whose values handed on left the tolerance: its ops made them.
  void note_region_numerics_change(const StructuralDifference& d) {
    if (out_->numerics_change) return;
    NumericsChange& n = out_->numerics_change.emplace();
    n.stream = name_;
    n.step = d.step;
    n.index = d.index_a;
    n.phase = d.phase;
    n.op = d.values->op_a;
    n.replaced_by = d.values->op_b;
    n.tensor = "value handed on";
    n.dtype = d.values->dtype;
    n.output_relative = d.values->relative;
    n.output_ulps = d.values->ulps;
    n.growth.push_back({d.index_a, n.op, n.phase, n.output_relative});
  }

  void count(const DivergentOp& op) {
    ++out_->divergent_ops;
    ++out_->summary.divergent;
    ++out_->per_step[op.step];
    if (op.beyond_tolerance) out_->beyond_tolerance = true;
    if (out_->divergent_orders.size() < kMaxMarkedOps) out_->divergent_orders.push_back(op.order);
    if (op.writes_training) {
      ++out_->divergent_training_writes;
    } else if (++out_->divergent_outside <= TrainingCheck::kMaxOutside) {
      out_->outside_training.push_back(fmt::format("{} (step {})", op.name, op.step));
    }
    StepPoint& p = out_->curve[op.step];
    ++p.divergent_ops;
    p.max_relative = std::max(p.max_relative, op.relative);
    for (uint64_t position : op.parameters) {
      bool& diverged = params_[position];
      if (!diverged) {
        diverged = true;
        out_->parameters.push_back({name_, position, op.name, op.step});
      }
    }
  }

  void remember_outputs(const BufferedOp& a, const BufferedOp& b) {
    for (const auto& [op, keys] : {std::pair{&a, &seen_.a}, std::pair{&b, &seen_.b}}) {
      if (keys->size() >= SeenOutputs::kMax || !op->outputs.present) continue;
      for (size_t i = 0; i < op->outputs.count; ++i)
        if (op->outputs.compared >> i & 1)
          keys->push_back({SeenOutputs::key(op->outputs.digests[i]),
                           uint32_t(std::min<uint64_t>(op->index, UINT32_MAX)), op->rec.name});
    }
  }

  // After the first divergence: the first collective of each group at or after it
  // (collectives_after in FirstDivergence).
  void track_collective(const BufferedOp& a) {
    if (a.collective && a.received) collectives_after_.emplace(a.coll.group, a.coll.seq);
  }

  // The loss: backward starts from ones_like(loss); the last such 0-dim input before the step's
  // first backward op is the step's loss. A sentinel trace has no backward ops and no ones_like:
  // there it is the last top-level forward op's 0-dim output before the optimizer.
  void track_loss(const BufferedOp& a, const BufferedOp& b) {
    if (a.rec.step != loss_step_) {
      loss_step_ = a.rec.step;
      loss_candidate_.reset();
      loss_from_ones_like_ = false;
      loss_taken_ = false;
    }
    if (loss_taken_) return;
    // An optimizer op before any candidate is zero_grad's, ahead of the forward.
    if (a.rec.phase == trace::Phase::kBackward ||
        (a.rec.phase == trace::Phase::kOptimizer && loss_candidate_)) {
      if (loss_candidate_)
        out_->loss[a.rec.step] = LossPoint{loss_candidate_->first, loss_candidate_->second};
      loss_taken_ = true;
      return;
    }
    const bool ones_like = a_->name_of(a.rec) == "aten::ones_like";
    const bool scalar_out = !ones_like && !loss_from_ones_like_ && a.rec.depth == 0 &&
                            a.rec.output_tensors.size() == 1 && b.rec.output_tensors.size() == 1;
    if (!ones_like && !scalar_out) return;
    const auto& ids_a = ones_like ? a.rec.input_tensors : a.rec.output_tensors;
    const auto& ids_b = ones_like ? b.rec.input_tensors : b.rec.output_tensors;
    if (ids_a.empty() || ids_b.empty()) return;
    const trace::TensorDesc* ta = a_->reader().tensor(ids_a[0]);
    const trace::TensorDesc* tb = b_->reader().tensor(ids_b[0]);
    if (ta && tb && ta->sizes.empty() && tb->sizes.empty() && (ta->bits & trace::kTensorHasStats) &&
        (tb->bits & trace::kTensorHasStats) && !(ta->bits & trace::kTensorIntStats)) {
      loss_candidate_.emplace(ta->stats.mean, tb->stats.mean);
      loss_from_ones_like_ = ones_like;
    }
  }

  // Parameters, approximately: the tensors a step's optimizer-phase ops write in place, the k-th
  // of the step at position k (a foreach or fused op writes lists: a position a tensor, its
  // written section's). Returns the positions among a's that differ from b's.
  std::vector<uint64_t> parameter_positions(const BufferedOp& a, const BufferedOp& b, bool differ) {
    if (a.rec.step != param_step_) {
      param_step_ = a.rec.step;
      param_pos_ = 0;
    }
    if (a.rec.phase != trace::Phase::kOptimizer) return {};
    std::string_view name = a_->name_of(a.rec);
    // A sentinel's step state record: what it leaves, a position each.
    if (!trace::is_step_state_record(name) &&
        (a.rec.scope != trace::Scope::kFunction || !ends_with_underscore(name) ||
         name == "aten::zero_" || name == "aten::_foreach_zero_"))
      return {};
    std::vector<uint64_t> diverged;
    for (size_t i = 0; i < a.rec.output_tensors.size() && param_pos_ < kMaxParameters; ++i) {
      const uint64_t pos = param_pos_++;
      if (params_.try_emplace(pos, false).second) ++out_->parameters_tracked;
      if (differ && i < b.rec.output_tensors.size()) {
        const trace::TensorDesc* ta = a_->reader().tensor(a.rec.output_tensors[i]);
        const trace::TensorDesc* tb = b_->reader().tensor(b.rec.output_tensors[i]);
        if (ta && tb && ta->has_contents() && tb->has_contents() && !ta->same_digest(*tb))
          diverged.push_back(pos);
      }
    }
    return diverged;
  }

  // Where a run of skipped ops sits: the chain of its first op within the run (outermost
  // first), the depth of the enclosing op still to come (-1: none), and whether every skipped
  // op is nested inside ops both runs ran.
  struct SkippedShape {
    std::vector<std::string> chain;
    int64_t need_depth = -1;
    bool nested = false;
    std::vector<std::string> outermost;  // distinct names at the smallest depth, in order
  };

  static SkippedShape shape_of(const OpSource& s, size_t n, const OpSource& other, size_t m) {
    SkippedShape sh;
    if (n == 0) return sh;
    const BufferedOp& first = s.at(0);
    sh.chain = {std::string(s.name_of(first.rec))};
    int64_t need = int64_t(first.rec.depth) - 1;
    uint32_t min_depth = first.rec.depth;
    for (size_t k = 1; k < n; ++k) {
      const BufferedOp& op = s.at(k);
      min_depth = std::min(min_depth, op.rec.depth);
      if (int64_t(op.rec.depth) == need) {
        sh.chain.insert(sh.chain.begin(), std::string(s.name_of(op.rec)));
        --need;
      }
    }
    for (size_t k = 0; k < m; ++k) min_depth = std::min(min_depth, other.at(k).rec.depth);
    sh.need_depth = need;
    sh.nested = min_depth > 0;
    for (size_t k = 0; k < n && sh.outermost.size() < 3; ++k) {
      const BufferedOp& op = s.at(k);
      std::string name(s.name_of(op.rec));
      if (op.rec.depth == min_depth &&
          std::find(sh.outermost.begin(), sh.outermost.end(), name) == sh.outermost.end())
        sh.outermost.push_back(std::move(name));
    }
    return sh;
  }

  void add_structural(StructuralDifference d) { add_structural(std::move(d), SkippedShape()); }

  // A resumed stream's op sequence differences at its resume step, and the ops the resumed run
  // alone runs at the next (DDP rebuilds its gradient buckets at a process's second iteration).
  bool fresh_process_structure(const StructuralDifference& d) const {
    const StreamWindow& w = limits_.window;
    if (!w.resume_step || out_->summary.alignment_lost) return false;
    if (d.step == *w.resume_step) return true;
    const bool resumed_only = w.resumed_run == 0 ? d.skipped_b == 0 && d.skipped_a > 0
                                                 : d.skipped_a == 0 && d.skipped_b > 0;
    return d.step == *w.resume_step + 1 && resumed_only;
  }

  void add_structural(StructuralDifference d, const SkippedShape& shape) {
    if (fresh_process_structure(d)) {
      ++out_->resume_step_structure_count;
      if (out_->resume_step_structure.size() < kMaxStructural)
        out_->resume_step_structure.push_back(std::move(d));
      return;
    }
    ++out_->structural_count;
    ++out_->summary.structural;
    // Between torch builds, decompositions and defaults change (zero_grad's set_to_none, a
    // kernel split in two); a refactor replaces ops with others for the same values; a kernel
    // allocates by thread count inside an op both ran. With the tolerance gate, the values
    // decide: those a replaced region hands on, and the ops around and after it.
    const bool replaced_alike = (d.values && d.values->matched()) || d.same_bits();
    if (replaced_alike) ++out_->structure_matched;
    if (d.same_bits()) ++out_->structure_same_bits;
    if (options_.gate.fail_on == "tolerance" && d.values && d.values->beyond > 0) {
      out_->beyond_tolerance = true;
      note_region_numerics_change(d);
    } else if (options_.gate.fail_on == "tolerance" &&
               (replaced_alike || shape.nested || torch_builds_differ(env_))) {
      // shape.nested: the ops both ran around it are compared, by their values.
      out_->structure_tolerated = true;
    } else {
      out_->beyond_tolerance = true;
    }
    // A difference still open came first, and may be what changed the sequence: it counts.
    confirm_open("an op sequence difference followed it");
    if (!first_done_ && open_.empty()) {
      FirstDivergence fd;
      fd.stream = name_;
      fd.process = process_;
      fd.rank = out_->rank;
      fd.step = d.step;
      fd.phase = d.phase;
      fd.op = d.op_a.empty() ? d.op_b : d.op_a;
      fd.chain = shape.chain.empty() ? std::vector<std::string>{fd.op} : shape.chain;
      fd.index = d.index_a;
      fd.order_a = d.order_a;
      fd.order_b = d.order_b;
      classify_structural(d.detail, &fd);
      fd.evidence.nested = shape.nested;
      fd.evidence.same_values = d.hands_on_same_bits();
      // Other ops for the same bits are the first divergence only if no value differs after.
      if (fd.evidence.same_values) {
        if (!same_values_first_) same_values_first_ = std::move(fd);
        if (out_->structural.size() < kMaxStructural) out_->structural.push_back(std::move(d));
        return;
      }
      // The enclosing ops are common to both runs and end later: collect them as they come.
      Candidate& c = open_.emplace_back();
      c.fd = std::move(fd);
      c.need_depth = shape.need_depth;
      c.confirmed = true;
      settle(/*at_end=*/false);
    }
    if (out_->structural.size() < kMaxStructural) out_->structural.push_back(std::move(d));
  }

  StructuralDifference structural_at(const BufferedOp* a, const BufferedOp* b) const {
    StructuralDifference d;
    d.stream = name_;
    const BufferedOp* any = a ? a : b;
    d.step = any->rec.step;
    d.phase = std::string(trace::phase_name(any->rec.phase));
    if (a) {
      d.index_a = a->index;
      d.order_a = a->rec.order;
      d.op_a = std::string(a_->name_of(a->rec));
    } else {
      d.index_a = a_->ops_read();
    }
    if (b) {
      d.index_b = b->index;
      d.order_b = b->rec.order;
      d.op_b = std::string(b_->name_of(b->rec));
    } else {
      d.index_b = b_->ops_read();
    }
    return d;
  }

  void resync() {
    a_->fill(kAlignWindow);
    b_->fill(kAlignWindow);
    StructuralDifference d = structural_at(&a_->at(0), &b_->at(0));
    auto at = find_resync(*a_, *b_);
    size_t i = at ? at->first : a_->size();
    size_t j = at ? at->second : b_->size();
    std::optional<MatchedRegion> region;
    if (at && i > 0 && j > 0 && i <= kMaxMatchedRegion && j <= kMaxMatchedRegion) {
      region = match_region(*a_, i, *b_, j, options_.gate);
      i = region->n;
      j = region->m;
    } else if (at && (i > 0) != (j > 0) && i + j <= kMaxMatchedRegion) {
      d.extra_values_read = i > 0 ? values_read_after(*a_, i) : values_read_after(*b_, j);
    }
    d.skipped_a = i;
    d.skipped_b = j;
    // The op reported is run A's first skipped op, or run B's when A skipped none.
    SkippedShape shape = i > 0 ? shape_of(*a_, i, *b_, j) : shape_of(*b_, j, *a_, i);
    std::string outermost;
    if (!shape.outermost.empty() &&
        !(shape.outermost.size() == 1 && shape.outermost[0] == shape.chain.back()))
      outermost = fmt::format(" (outermost: {})", fmt::join(shape.outermost, ", "));
    if (!at) {
      out_->summary.alignment_lost = true;
      d.detail = fmt::format(
          "op sequences differ and do not realign within {} ops "
          "(skipped {} of run A, {} of run B)",
          kAlignWindow, i, j);
    } else if (i == 0) {
      d.detail = fmt::format("run B has {} extra op(s) here, starting with {}{}", j, d.op_b,
                             outermost);
      d.op_a.clear();
    } else if (j == 0) {
      d.detail = fmt::format("run A has {} extra op(s) here, starting with {}{}", i, d.op_a,
                             outermost);
      d.op_b.clear();
    } else if (i == 1 && j == 1 && d.op_a == d.op_b) {
      d.detail = fmt::format("{}: different input/output shapes or dtypes, or nesting", d.op_a);
    } else {
      d.detail = fmt::format("{} op(s) of run A ({}...) replaced by {} of run B ({}...){}", i,
                             d.op_a, j, d.op_b, outermost);
    }
    if (shape.nested) d.detail += "; all inside ops both runs ran (their internal ops differ)";
    if (region) {
      if (region->stretches > 1)
        d.detail += fmt::format(
            "; {} stretches of other ops in another order, the ops both ran between them "
            "matched with them",
            region->stretches);
      d.values = std::move(region->values);
      d.detail += "; " + region_values_text(*d.values);
    }
    if (d.extra_values_read)
      d.detail += fmt::format(
          "; the {} value(s) its ops make that are read after it reach the ops compared there",
          d.extra_values_read);
    add_structural(std::move(d), shape);
    a_->pop(i);
    b_->pop(j);
  }

  // Drains what one side has left after the other ended; returns how many ops.
  uint64_t drain(OpSource& s) {
    uint64_t n = 0;
    for (;;) {
      size_t k = s.fill(OpSource::kCapacity);
      if (k == 0) break;
      n += k;
      s.pop(k);
    }
    return n;
  }

  Status check_corrupt(const OpSource& s) {
    if (s.stop_result() == ReadResult::kCorrupt)
      return Status::error(s.reader().error(), ExitCode::kBadInput);
    return Status();
  }

  void note_truncated(const char* run, const trace::TraceReader& r, ReadResult res) {
    Truncation t;
    t.run = run;
    t.stream = name_;
    t.file = r.path();
    t.offset = res == ReadResult::kTruncated ? r.offset() : r.bytes_read();
    const trace::EndInfo& end = r.end_info();
    t.message = res == ReadResult::kTruncated ? r.error()
                : r.saw_end() && end.signal != 0
                    ? fmt::format("{}: offset {}: the process was {} {} here{}", r.path(), t.offset,
                                  end.signal == SIGTERM || end.signal == SIGINT ? "stopped by"
                                                                                : "killed by",
                                  trace::signal_text(end.signal),
                                  end.open_op.empty() ? "" : " inside " + end.open_op)
                : r.saw_end() ? fmt::format(
                                    "{}: offset {}: ended early, its run having lost a node "
                                    "or rank its collectives needed",
                                    r.path(), t.offset)
                              : fmt::format(
                                    "{}: offset {}: no END record: the process did not exit "
                                    "cleanly",
                                    r.path(), t.offset);
    t.ops_compared = out_->summary.compared;
    out_->truncated.push_back(std::move(t));
    out_->summary.truncated = true;
  }

  Status finish(trace::TraceReader& ra, trace::TraceReader& rb) {
    OpSource& a = *a_;
    OpSource& b = *b_;
    if (Status s = check_corrupt(a); !s.ok()) return s;
    if (Status s = check_corrupt(b); !s.ok()) return s;
    // A stream stopped at its consumer's last step ended on purpose, not cut.
    bool cut_a = !ra.saw_end() && !a.stopped_at_step_limit();
    bool cut_b = !rb.saw_end() && !b.stopped_at_step_limit();

    // A crash's END closes the stream where the process died: when the other run went on, the
    // rest was not compared, as for a cut; when both end together, nothing is missing. So does
    // the end of a rank whose run lost a node: its collectives failed.
    const bool killed_a = ra.saw_end() && ra.end_info().signal != 0;
    const bool killed_b = rb.saw_end() && rb.end_info().signal != 0;
    cut_a = cut_a || killed_a || limits_.world_lost_a;
    cut_b = cut_b || killed_b || limits_.world_lost_b;
    bool more_a = a.size() > 0, more_b = b.size() > 0;
    if ((more_a && cut_b) || (more_b && cut_a)) {
      // One side stopped early because it was cut: compare up to the cut, say so.
      uint64_t rest_a = drain(a), rest_b = drain(b);
      if (Status s = check_corrupt(a); !s.ok()) return s;
      if (Status s = check_corrupt(b); !s.ok()) return s;
      (void)rest_a;
      (void)rest_b;
      if (cut_a && more_b) note_truncated("a", ra, a.stop_result());
      if (cut_b && more_a) note_truncated("b", rb, b.stop_result());
    } else if (more_a || more_b) {
      OpSource& longer = more_a ? a : b;
      StructuralDifference d = structural_at(more_a ? &a.at(0) : nullptr,
                                             more_b ? &b.at(0) : nullptr);
      uint64_t rest = drain(longer);
      if (Status s = check_corrupt(longer); !s.ok()) return s;
      (more_a ? d.skipped_a : d.skipped_b) = rest;
      d.detail = fmt::format("run {} has {} more op(s) from step {} ({}): the other run ended",
                             more_a ? "A" : "B", rest, d.step, more_a ? d.op_a : d.op_b);
      add_structural(std::move(d));
    } else {
      // Both ended together; a cut inside a record still lost data.
      bool tr_a = a.stop_result() == ReadResult::kTruncated;
      bool tr_b = b.stop_result() == ReadResult::kTruncated;
      if (tr_a) note_truncated("a", ra, a.stop_result());
      if (tr_b) note_truncated("b", rb, b.stop_result());
      // One side lacks its END: its process may have gone on to ops the other never ran.
      const bool open_a = !ra.saw_end() && !a.stopped_at_step_limit();
      const bool open_b = !rb.saw_end() && !b.stopped_at_step_limit();
      if (!tr_a && !tr_b && open_a != open_b)
        note_truncated(open_a ? "a" : "b", open_a ? ra : rb, ReadResult::kEof);
    }
    // After the drains above: an END read only then is no cut.
    out_->cut_a = (!ra.saw_end() && !a.stopped_at_step_limit()) ||
                  a.stop_result() == ReadResult::kTruncated;
    out_->cut_b = (!rb.saw_end() && !b.stopped_at_step_limit()) ||
                  b.stop_result() == ReadResult::kTruncated;
    compare_step_settings(ra, rb);
    for (const OpSource* src : {&a, &b})
      for (uint32_t id : src->compiled_regions()) {
        std::string name(src->reader().string(id));
        auto& regions = out_->summary.compiled_regions;
        if (std::find(regions.begin(), regions.end(), name) == regions.end())
          regions.push_back(std::move(name));
      }
    out_->summary.compiled_kernels = a.compiled_kernels();
    out_->summary.compiled_kernels_b = b.compiled_kernels();
    out_->summary.ops_a = a.ops_read();
    out_->summary.ops_b = b.ops_read();
    out_->records_a = a.records_read();
    out_->records_b = b.records_read();
    out_->bytes = ra.bytes_read() + rb.bytes_read();
    return Status();
  }

  // The first step whose intra-op threads or determinism bits differ between the runs.
  void compare_step_settings(const trace::TraceReader& ra, const trace::TraceReader& rb) {
    const auto& sa = ra.steps();
    const auto& sb = rb.steps();
    for (size_t i = 0; i < std::min(sa.size(), sb.size()); ++i) {
      if (sa[i].intra_op_threads != sb[i].intra_op_threads)
        out_->step_settings.push_back({process_, "intra_op_threads",
                                       std::to_string(sa[i].intra_op_threads),
                                       std::to_string(sb[i].intra_op_threads)});
      if (sa[i].determinism_bits != sb[i].determinism_bits)
        out_->step_settings.push_back({process_, "step.determinism_bits",
                                       fmt::format("{:#x}", sa[i].determinism_bits),
                                       fmt::format("{:#x}", sb[i].determinism_bits)});
      if (!out_->step_settings.empty()) {
        for (EnvDifference& d : out_->step_settings) d.key += fmt::format(" (step {})", sa[i].step);
        return;
      }
    }
  }

  static constexpr uint64_t kMaxParameters = 100000;
  static constexpr size_t kMaxMarkedOps = 1000000;  // for the timeline's marks

  std::string name_, process_;
  const DiffOptions& options_;
  const std::vector<EnvDifference>& env_;
  const ProgressFn& progress_;
  StreamResult* out_;
  StreamLimits limits_;
  const std::map<std::string, std::string>* fingerprint_a_;
  uint64_t loss_step_ = UINT64_MAX;
  std::optional<std::pair<double, double>> loss_candidate_;
  bool loss_taken_ = false;
  bool loss_from_ones_like_ = false;
  OpSource* a_ = nullptr;
  OpSource* b_ = nullptr;
  uint64_t total_bytes_ = 0;
  static constexpr size_t kMaxOpen = 64;  // candidates open at once; more confirm the oldest
  std::deque<Candidate> open_;
  bool first_done_ = false;
  std::optional<FirstDivergence> same_values_first_;  // the first region of other ops, same bits
  struct SeenCollective {
    uint64_t index, group, seq;
  };
  std::vector<SeenCollective> collectives_open_;  // while candidates are open
  std::map<uint64_t, uint64_t> collectives_before_, collectives_after_;  // group -> seq
  SeenOutputs seen_;
  uint64_t param_step_ = UINT64_MAX, param_pos_ = 0;
  std::map<uint64_t, bool> params_;
};

}  // namespace

Status compare_stream(const std::string& name, const std::string& path_a, const std::string& path_b,
                      const DiffOptions& options, const std::vector<EnvDifference>& env,
                      const ProgressFn& progress, StreamResult* out, const StreamLimits& limits,
                      const std::map<std::string, std::string>* fingerprint_a) {
  out->summary.name = name;
  out->summary.in_a = out->summary.in_b = true;
  StreamComparator c(name, options, env, progress, out, limits, fingerprint_a);
  return c.run(path_a, path_b);
}

Status count_stream(const std::string& name, const std::string& path, bool in_a, StreamResult* out,
                    const OpTap& on_op) {
  out->summary.name = name;
  out->summary.in_a = in_a;
  out->summary.in_b = !in_a;
  trace::TraceReader r;
  if (Status s = r.open(path); !s.ok()) return s;
  out->rank = r.header().rank;
  OpSource src(&r);
  src.tap(on_op);
  uint64_t n = 0;
  std::optional<BufferedOp> first;
  for (;;) {
    size_t k = src.fill(OpSource::kCapacity);
    if (k == 0) break;
    if (!first) first = src.at(0);
    n += k;
    src.pop(k);
  }
  if (src.stop_result() == ReadResult::kCorrupt)
    return Status::error(r.error(), ExitCode::kBadInput);
  (in_a ? out->max_step_a : out->max_step_b) = src.max_step();
  (in_a ? out->tail_a : out->tail_b) = tail_of(src);
  (in_a ? out->summary.ops_a : out->summary.ops_b) = n;
  (in_a ? out->records_a : out->records_b) = src.records_read();
  out->bytes = r.bytes_read();
  // Not a divergence: nothing to compare it with. diff_runs lists it as not compared, which
  // makes the comparison incomplete (exit 5), unless it is a worker's prefetch.
  if (first) out->unpartnered_first_step = first->rec.step;
  return Status();
}

}  // namespace detaudit
