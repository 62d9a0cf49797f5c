// A run resumed from a checkpoint, diffed against one that ran through (src/diff/resume.h), on
// traces written by hand: the resume step found from the tensors the resumed process read, its
// setup passed over, and a difference planted after the resume found there.
#include "diff/resume.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <utility>

#include "diff/diff.h"
#include "report_printers.h"
#include "trace_builder.h"

namespace detaudit {
namespace {

using namespace detaudit::testing;

// A training step: a batch read (index), a forward op reading the step's parameters, and the
// optimizer's update. Step s's parameters are fill 0x40 + s; its batch 0x20 + s % 2 (two
// batches, read again and again: they tell no step).
void train_step(TraceBuilder& t, uint64_t step, uint8_t params_fill) {
  t.step(step);
  const int64_t x =
      t.op("aten::index").in_new(tensor(0x10)).out_new(tensor(uint8_t(0x20 + step % 2))).done();
  const int64_t w = t.op("aten::linear")
                        .in_ref(x)
                        .in_new(tensor(params_fill))
                        .out_new(tensor(uint8_t(0x80 + params_fill)))
                        .done();
  t.op("aten::add_", Phase::kOptimizer)
      .in_ref(w)
      .in_double(-0.1)
      .out_new(tensor(uint8_t(params_fill + 1)))
      .done();
}

// The resumed process: building and loading (a fill and a copy of the loaded parameters), then
// its steps from `from` on, counted from 0; `planted` changes the parameters it reads at that
// step of run A's numbering.
// `extra_at`: a step at which it runs a broadcast first, as DDP's bucket rebuild.
TraceBuilder resumed(uint64_t from, uint64_t to, std::optional<uint64_t> planted = {},
                     std::optional<uint64_t> extra_at = {}) {
  TraceBuilder t(0, "main~1");
  t.op("aten::uniform_").in_new(tensor(0x01)).out_new(tensor(0x02)).done();
  t.op("aten::copy_").in_new(tensor(0x02)).in_new(tensor(uint8_t(0x40 + from))).done();
  for (uint64_t s = from; s < to; ++s) {
    uint8_t fill = uint8_t(0x40 + s);
    if (planted && s == *planted) fill ^= 0x80;
    if (extra_at && s == *extra_at) {
      t.step(s - from);
      t.op("c10d::broadcast_").in_new(tensor(0x05)).out_new(tensor(0x05)).done();
    }
    train_step(t, s - from, fill);
  }
  t.end();
  return t;
}

TraceBuilder through(uint64_t to) {
  TraceBuilder t;
  for (uint64_t s = 0; s < to; ++s) train_step(t, s, uint8_t(0x40 + s));
  t.end();
  return t;
}

DiffReport diff(const RunDir& a, const RunDir& b, std::optional<uint64_t> given = {}) {
  DiffOptions o;
  o.resume_step = given;
  DiffReport r;
  Status s = diff_runs(a.path(), b.path(), o, &r);
  EXPECT_TRUE(s.ok()) << s.message();
  return r;
}

TEST(ResumeTest, TheResumeStepIsFoundAndTheResumedPartIsCompared) {
  RunDir a("resume_through/run-0"), b("resume_resumed/run-0");
  a.add_stream("r0.main.t-main", through(6));
  b.add_stream("r0.main.t-main", through(4));
  b.add_stream("r0.main~1.t-main", resumed(4, 6));
  DiffReport r = diff(a, b);
  EXPECT_EQ(r.verdict, Verdict::kIdentical)
      << (r.first ? r.first->evidence.detail : r.notes.front());
  ASSERT_EQ(r.resumes.size(), 1u);
  const ResumedProcess& rp = r.resumes[0];
  EXPECT_EQ(rp.run, 1);
  EXPECT_EQ(rp.process, "r0.main~1");
  EXPECT_EQ(rp.continues, "r0.main");
  EXPECT_EQ(rp.step, 4u);
  EXPECT_EQ(rp.setup_ops, 2u) << "uniform_ and copy_, the batch's index is the step's";
  EXPECT_NE(rp.found_by.find("read at step 4 only (aten::linear first)"), std::string::npos)
      << rp.found_by;
  EXPECT_TRUE(rp.verified);
  // 3 ops a step: steps 0-3 in the first pair, 4-5 in the resumed one.
  EXPECT_EQ(r.ops_compared, 18u);
}

TEST(ResumeTest, ADifferenceAfterTheResumeIsFoundAtItsStepInTheOtherRunsNumbering) {
  RunDir a("resume_planted_a/run-0"), b("resume_planted_b/run-0");
  a.add_stream("r0.main.t-main", through(7));
  b.add_stream("r0.main.t-main", through(4));
  b.add_stream("r0.main~1.t-main", resumed(4, 7, /*planted=*/5));
  DiffReport r = diff(a, b);
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->stream, "r0.main~1.t-main");
  EXPECT_EQ(r.first->step, 5u);
  EXPECT_EQ(r.first->op, "aten::linear");
  ASSERT_EQ(r.resumes.size(), 1u);
  EXPECT_EQ(r.resumes[0].step, 4u);
  EXPECT_FALSE(r.resumes[0].verified);
}

TEST(ResumeTest, WithNothingToTellTheStepTheReportAsksForItAndTakesItGiven) {
  // The resumed process read step 0's parameters: nothing it read is run A's at one later step.
  RunDir a("resume_blind_a/run-0"), b("resume_blind_b/run-0");
  a.add_stream("r0.main.t-main", through(6));
  b.add_stream("r0.main.t-main", through(4));
  TraceBuilder blind(0, "main~1");
  for (uint64_t s = 0; s < 2; ++s) train_step(blind, s, uint8_t(0x40 + s));
  blind.end();
  b.add_stream("r0.main~1.t-main", blind);
  DiffReport r = diff(a, b);
  EXPECT_TRUE(r.resumes.empty());
  ASSERT_FALSE(r.notes.empty());
  EXPECT_NE(r.notes.back().find("--resume-step"), std::string::npos) << r.notes.back();
  r = diff(a, b, 4);
  ASSERT_EQ(r.resumes.size(), 1u);
  EXPECT_EQ(r.resumes[0].found_by, "--resume-step");
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->stream, "r0.main~1.t-main");
  EXPECT_EQ(r.first->step, 4u) << "step 0's parameters read where run A read step 4's";
}

TEST(ResumeTest, OpsTheResumedProcessAloneRunsAtItsSecondStepAreNotCounted) {
  // DDP rebuilds its buckets at a process's second iteration: a broadcast the other run ran in
  // its own second step, long before.
  for (uint64_t extra_at : {5, 6}) {
    RunDir a(fmt::format("resume_extra_a{}/run-0", extra_at));
    RunDir b(fmt::format("resume_extra_b{}/run-0", extra_at));
    a.add_stream("r0.main.t-main", through(8));
    b.add_stream("r0.main.t-main", through(4));
    b.add_stream("r0.main~1.t-main", resumed(4, 8, {}, extra_at));
    DiffReport r = diff(a, b);
    if (extra_at == 5) {
      EXPECT_EQ(r.verdict, Verdict::kIdentical);
      EXPECT_EQ(r.structural_count, 0u);
      ASSERT_FALSE(r.notes.empty());
      EXPECT_NE(r.notes[0].find("at step 5 (c10d::broadcast_), ops run in its second only"),
                std::string::npos)
          << r.notes[0];
    } else {
      EXPECT_EQ(r.verdict, Verdict::kDivergent) << "its third step is no fresh process's";
      EXPECT_EQ(r.structural_count, 1u);
    }
  }
}

// A gradient bucket all-reduced at each step, then the step as train_step: the bucket's bytes
// are `bucket` (its statistics those of fill 0x30 unless `stats` says otherwise), its values
// read back into the gradient.
void bucketed_step(TraceBuilder& t, uint64_t step, uint8_t params_fill, uint8_t bucket,
                   std::optional<trace::TensorStats> stats = {}) {
  t.step(step);
  TensorDesc out = tensor(bucket, {64});
  out.stats = stats.value_or(tensor(0x30, {64}).stats);
  t.op("c10d::allreduce_").in_new(tensor(0x31, {64})).out_new(out).done();
  const int64_t w = t.op("aten::linear")
                        .in_new(tensor(uint8_t(0x20 + step % 2)))
                        .in_new(tensor(params_fill))
                        .out_new(tensor(uint8_t(0x80 + params_fill)))
                        .done();
  t.op("aten::add_", Phase::kOptimizer)
      .in_ref(w)
      .in_double(-0.1)
      .out_new(tensor(uint8_t(params_fill + 1)))
      .done();
}

// Run A through 6 steps; run B stopped at 4 and resumed, its first bucket laid out anew
// (`first_bucket`, with `stats`), and the optimizer's update of step `planted` other bits.
DiffReport bucket_laid_out_anew(const std::string& name, uint8_t first_bucket,
                                std::optional<trace::TensorStats> stats,
                                std::optional<uint64_t> planted) {
  RunDir a(name + "_a/run-0"), b(name + "_b/run-0");
  TraceBuilder ta, tb, tr(0, "main~1");
  for (uint64_t s = 0; s < 6; ++s) bucketed_step(ta, s, uint8_t(0x40 + s), 0x30);
  for (uint64_t s = 0; s < 4; ++s) bucketed_step(tb, s, uint8_t(0x40 + s), 0x30);
  tr.op("aten::copy_").in_new(tensor(0x02)).in_new(tensor(0x44)).done();
  for (uint64_t s = 4; s < 6; ++s) {
    uint8_t fill = uint8_t(0x40 + s);
    if (planted && s == *planted) fill ^= 0x80;
    bucketed_step(tr, s - 4, fill, s == 4 ? first_bucket : 0x30, s == 4 ? stats : std::nullopt);
  }
  for (TraceBuilder* t : {&ta, &tb, &tr}) t->end();
  a.add_stream("r0.main.t-main", ta);
  b.add_stream("r0.main.t-main", tb);
  b.add_stream("r0.main~1.t-main", tr);
  return diff(a, b, 4);
}

TEST(ResumeTest, TheSameValuesInAnotherOrderAtTheResumeStepAreSaidNotCounted) {
  // Other bytes, the same statistics: the bucket a fresh process fills in parameter order.
  DiffReport r = bucket_laid_out_anew("fresh_layout", 0x35, {}, {});
  EXPECT_EQ(r.verdict, Verdict::kIdentical) << (r.first ? r.first->op : "");
  ASSERT_EQ(r.resumes.size(), 1u);
  EXPECT_EQ(r.resumes[0].reordered_ops, 1u);
  ASSERT_FALSE(r.notes.empty());
  EXPECT_NE(r.notes.back().find("1 op(s) held the same values as run A's in another order, "
                                "c10d::allreduce_ (output 0: 64 float32 values"),
            std::string::npos)
      << r.notes.back();
}

TEST(ResumeTest, ALaterDifferenceAfterABucketLaidOutAnewIsTheFirstDivergence) {
  // The optimizer's state not restored, under DDP: the bucket laid out anew is not the first
  // divergence, the update that differs is (each rank's bucket was: none came first).
  DiffReport r = bucket_laid_out_anew("fresh_layout_later", 0x35, {}, 5);
  ASSERT_TRUE(r.first);
  EXPECT_EQ(std::make_pair(r.first->step, r.first->op),
            std::make_pair(uint64_t(5), std::string("aten::linear")));
  EXPECT_EQ(r.resumes[0].reordered_ops, 1u);
}

TEST(ResumeTest, OtherValuesInTheFirstBucketAreTheFirstDivergence) {
  trace::TensorStats other = tensor(0x30, {64}).stats;
  other.max += 1e-6;
  DiffReport r = bucket_laid_out_anew("fresh_layout_other", 0x35, other, {});
  ASSERT_TRUE(r.first);
  EXPECT_EQ(std::make_pair(r.first->step, r.first->op),
            std::make_pair(uint64_t(4), std::string("c10d::allreduce_")));
  EXPECT_EQ(r.resumes[0].reordered_ops, 0u);
}

}  // namespace
}  // namespace detaudit
