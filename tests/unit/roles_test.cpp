// What a tensor is to training (src/diff/roles.h), on a training loop written by hand: each role
// from the data flow (who made a version, which phases read it, whether a path from it reaches
// a training-state write), one test per role, and the reach of a difference.
#include "diff/roles.h"

#include <gtest/gtest.h>

#include "diff/diff.h"
#include "diff/partial.h"
#include "diff/report_model.h"
#include "trace_builder.h"

namespace detaudit {
namespace {

using namespace detaudit::testing;

TensorDesc external(uint8_t fill, std::vector<int64_t> sizes = {4, 4}) {
  return tensor(fill, std::move(sizes), Provenance::kExternal);
}

// Two steps of a loop: a batch and the weight in, a linear, a dropout mask, a loss, its
// gradient, Adam-like updates of the weight and of a step count, and a loss summed for logging.
// The program orders of the ops asked about below.
struct Loop {
  TraceBuilder t;
  uint64_t linear = 0, mask = 0, backward = 0, update = 0, count = 0, logged = 0;

  Loop() {
    int64_t weight = -1, steps = -1, sum = -1;
    for (uint64_t step = 0; step < 2; ++step) {
      t.step(step);
      auto lin = t.op("aten::linear").in_new(external(uint8_t(0x20 + step)));
      if (weight < 0) {
        lin.in_new(external(0x40));
        weight = lin.last_id();
      } else {
        lin.in_ref(weight);
      }
      if (step == 1) linear = t.reserve_orders(0);
      const int64_t h = lin.out_new(tensor(uint8_t(0x50 + step))).done();
      if (step == 1) mask = t.reserve_orders(0);
      const int64_t m = t.op("aten::bernoulli").random(7).in_ref(h).out_new(tensor(0x60)).done();
      const int64_t loss = t.op("aten::mse_loss")
                               .in_ref(h)
                               .in_ref(m)
                               .out_new(tensor(uint8_t(0x70 + step), {}))
                               .done();
      if (step == 1) logged = t.reserve_orders(0);
      auto add = t.op("aten::add_");
      if (sum < 0) {
        add.in_new(external(0x00, {}));
      } else {
        add.in_ref(sum);
      }
      sum = add.in_ref(loss).out_new(tensor(uint8_t(0x78 + step), {})).done();
      t.op("aten::item").in_ref(sum).out_double(1.0).done();
      if (step == 1) backward = t.reserve_orders(0);
      const int64_t grad = t.op("aten::mm", Phase::kBackward)
                               .in_ref(h)
                               .in_ref(loss)
                               .out_new(tensor(uint8_t(0x90 + step)))
                               .done();
      if (step == 1) count = t.reserve_orders(0);
      auto counting = t.op("aten::add_", Phase::kOptimizer);
      if (steps < 0) {
        counting.in_new(external(0x00, {}));
      } else {
        counting.in_ref(steps);
      }
      steps = counting.in_int(1).out_new(tensor(uint8_t(0xa0 + step), {})).done();
      t.op("aten::pow", Phase::kOptimizer).in_ref(steps).out_new(tensor(0xb0, {})).done();
      if (step == 1) update = t.reserve_orders(0);
      weight = t.op("aten::add_", Phase::kOptimizer)
                   .in_ref(weight)
                   .in_ref(grad)
                   .out_new(tensor(uint8_t(0x41 + step)))
                   .done();
    }
    t.end();
  }
};

// Each tensor of the op of program order `order`: asked for its inputs (mask of their indices)
// and outputs.
struct Asked {
  std::vector<RoleTracker::Answer> inputs, outputs;
};

Asked ask(const TraceBuilder& t, uint64_t order, uint64_t inputs, uint64_t outputs) {
  RunDir dir("roles");
  dir.add_stream("r0.main.t-main", t);
  trace::TraceReader r;
  EXPECT_TRUE(r.open(dir.stream_path("r0.main.t-main")).ok());
  RoleTracker roles;
  while (r.next() == trace::ReadResult::kRecord)
    if (r.kind() == trace::RecordKind::kOp)
      roles.op(r.op(), r, r.op().order == order, inputs, outputs);
  EXPECT_TRUE(roles.watched());
  return {roles.inputs(), roles.outputs()};
}

TEST(RolesTest, AWeightTheForwardReadsAndTheOptimizerWritesIsAParameter) {
  Loop loop;
  // Step 1's linear reads the weight step 0's optimizer wrote; its update writes the next one,
  // which no op reads again (the last step): a parameter by what its maker read.
  Asked read = ask(loop.t, loop.linear, 0b10, 0);
  EXPECT_EQ(read.inputs.at(0).role, TensorRole::kParameter);
  EXPECT_TRUE(read.inputs.at(0).reaches_training);
  Asked last = ask(loop.t, loop.update, 0b01, 0b1);
  EXPECT_EQ(last.inputs.at(0).role, TensorRole::kParameter);
  EXPECT_EQ(last.outputs.at(0).role, TensorRole::kParameter);
}

TEST(RolesTest, WhatTheBackwardPassMakesIsAGradient) {
  Loop loop;
  Asked a = ask(loop.t, loop.backward, 0, 0b1);
  EXPECT_EQ(a.outputs.at(0).role, TensorRole::kGradient);
  EXPECT_TRUE(a.outputs.at(0).reaches_training);
}

TEST(RolesTest, ACountOnlyTheOptimizerWritesAndReadsIsItsState) {
  Loop loop;
  Asked a = ask(loop.t, loop.count, 0b01, 0b1);
  EXPECT_EQ(a.inputs.at(0).role, TensorRole::kOptimizerState);
  EXPECT_EQ(a.outputs.at(0).role, TensorRole::kOptimizerState);
  EXPECT_TRUE(a.outputs.at(0).reaches_training);
}

TEST(RolesTest, DataEnteringTheForwardPassIsABatch) {
  Loop loop;
  Asked a = ask(loop.t, loop.linear, 0b01, 0);
  EXPECT_EQ(a.inputs.at(0).role, TensorRole::kBatch);
  EXPECT_TRUE(a.inputs.at(0).reaches_training);
}

TEST(RolesTest, WhatAForwardOpWritesIntoAnArgumentItDoesNotReturnIsAModelBuffer) {
  // batch_norm in training: its output returned, its running mean written in place.
  TraceBuilder t;
  t.step(0);
  t.op("aten::native_batch_norm")
      .in_new(external(0x01))
      .in_new(external(0x02, {4}))
      .out_new(tensor(0x03))
      .written_new("running_mean", tensor(0x04, {4}))
      .done();
  t.end();
  Asked a = ask(t, 0, 0, 0b10);
  EXPECT_EQ(a.outputs.at(0).role, TensorRole::kModelBuffer);
  EXPECT_TRUE(a.outputs.at(0).reaches_training);
}

// GradScaler's loop: the loss scaled (forward), its gradient (backward), the gradient unscaled in
// place outside the passes, the optimizer's update, then the scale updated for the next step. An
// LR held in a tensor, set outside the passes from no gradient, is read by the optimizer alone.
struct ScaledLoop {
  TraceBuilder t;
  uint64_t scaled = 0, unscale = 0, update = 0, next_scale = 0;

  ScaledLoop() {
    t.step(0);
    auto lin = t.op("aten::linear").in_new(external(0x20)).in_new(external(0x40));
    const int64_t weight = lin.last_id();
    const int64_t h = lin.out_new(tensor(0x50)).done();
    scaled = t.reserve_orders(0);
    auto mul = t.op("aten::mul").in_ref(h).in_new(external(0x10, {}));
    const int64_t scale = mul.last_id();
    mul.out_new(tensor(0x51)).done();
    const int64_t grad =
        t.op("aten::mm", Phase::kBackward).in_ref(h).in_ref(scale).out_new(tensor(0x90)).done();
    unscale = t.reserve_orders(0);
    const int64_t unscaled = t.op("aten::_amp_foreach_non_finite_check_and_unscale_")
                                 .in_ref(grad)
                                 .written_new("self", tensor(0x91))
                                 .done();
    const int64_t lr =
        t.op("aten::fill_").in_new(external(0x30, {})).out_new(tensor(0x31, {})).done();
    update = t.reserve_orders(0);
    t.op("aten::add_", Phase::kOptimizer)
        .in_ref(weight)
        .in_ref(unscaled)
        .in_ref(lr)
        .out_new(tensor(0x41))
        .done();
    next_scale = t.reserve_orders(0);
    t.op("aten::_amp_update_scale_").in_ref(scale).out_new(tensor(0x11, {})).done();
    t.end();
  }
};

TEST(RolesTest, GradScalersScaleAndAnLrInATensorAreHyperparameters) {
  ScaledLoop loop;
  Asked scale = ask(loop.t, loop.next_scale, 0, 0b1);
  EXPECT_EQ(scale.outputs.at(0).role, TensorRole::kHyperparameter);
  Asked update = ask(loop.t, loop.update, 0b110, 0);
  EXPECT_EQ(update.inputs.at(1).role, TensorRole::kHyperparameter);  // the LR
  EXPECT_TRUE(update.inputs.at(1).reaches_training);
  EXPECT_EQ(update.inputs.at(0).role, TensorRole::kGradient);  // the unscaled gradient
  EXPECT_TRUE(is_training_state(TensorRole::kHyperparameter));
  EXPECT_STREQ(tensor_role_name(TensorRole::kHyperparameter), "hyperparameter");
}

TEST(RolesTest, AGradientUnscaledOutsideThePassesIsStillAGradient) {
  ScaledLoop loop;
  // Written in place by a forward-phase op from the backward pass's gradient: not a buffer.
  Asked a = ask(loop.t, loop.unscale, 0, 0b1);
  EXPECT_EQ(a.outputs.at(0).role, TensorRole::kGradient);
}

TEST(RolesTest, ADrawFromAGeneratorIsARandomDraw) {
  Loop loop;
  Asked a = ask(loop.t, loop.mask, 0, 0b1);
  EXPECT_EQ(a.outputs.at(0).role, TensorRole::kRandomDraw);
}

TEST(RolesTest, AForwardOutputTheBackwardPassReadsIsAnActivation) {
  Loop loop;
  Asked a = ask(loop.t, loop.linear, 0, 0b1);
  EXPECT_EQ(a.outputs.at(0).role, TensorRole::kActivation);
  EXPECT_TRUE(a.outputs.at(0).reaches_training);
}

TEST(RolesTest, ALossSummedForLoggingReachesNoTrainingState) {
  Loop loop;
  // Step 1's sum: its old value and its new one reach only the next sum and item().
  Asked a = ask(loop.t, loop.logged, 0b01, 0b1);
  EXPECT_EQ(a.inputs.at(0).role, TensorRole::kOutsideTraining);
  EXPECT_FALSE(a.inputs.at(0).reaches_training);
  EXPECT_EQ(a.outputs.at(0).role, TensorRole::kOutsideTraining);
  EXPECT_FALSE(a.outputs.at(0).reaches_training);
}

// Two training steps, each followed by an evaluation with autograd off: a linear of a batch of
// its own with the weight. Run B's evaluation outputs are `eval_from` on (a race there).
TraceBuilder evaluated_loop(uint8_t eval_from) {
  TraceBuilder t;
  int64_t weight = -1;
  for (int step = 0; step < 2; ++step) {
    t.step(uint64_t(step));
    auto lin = t.op("aten::linear").in_new(external(uint8_t(0x20 + step)));
    if (weight < 0) {
      lin.in_new(external(0x40));
      weight = lin.last_id();
    } else {
      lin.in_ref(weight);
    }
    const int64_t h = lin.out_new(tensor(uint8_t(0x50 + step))).done();
    const int64_t grad =
        t.op("aten::mm", Phase::kBackward).in_ref(h).out_new(tensor(uint8_t(0x90 + step))).done();
    weight = t.op("aten::add_", Phase::kOptimizer)
                 .in_ref(weight)
                 .in_ref(grad)
                 .out_new(tensor(uint8_t(0x41 + step)))
                 .done();
    const int64_t scores = t.op("aten::linear")
                               .grad_off()
                               .in_new(external(uint8_t(0x30 + step)))
                               .in_ref(weight)
                               .out_new(tensor(uint8_t(eval_from + step)))
                               .done();
    t.op("aten::argmax").grad_off().in_ref(scores).out_new(tensor(uint8_t(eval_from + 8))).done();
  }
  t.end();
  return t;
}

TEST(RolesTest, WhatAForwardWithAutogradOffMakesAndReachesNoTrainingIsAnEvaluation) {
  const TraceBuilder t = evaluated_loop(0x10);
  // Step 1's evaluation linear (orders: 3 training ops and 2 evaluation ops a step).
  Asked a = ask(t, 8, 0b11, 0b1);
  EXPECT_EQ(a.inputs.at(0).role, TensorRole::kEvaluation);  // its batch, read with autograd off
  EXPECT_EQ(a.inputs.at(1).role, TensorRole::kParameter);
  EXPECT_EQ(a.outputs.at(0).role, TensorRole::kEvaluation);
  EXPECT_FALSE(a.outputs.at(0).reaches_training);
}

TEST(RolesTest, AnEvaluationThatDiffersFailsTheDefaultGateAndPassesTheTrainingGate) {
  for (const char* gate : {"any", "training"}) {
    RunDir a(std::string("evaluation-") + gate + "/run-0"),
        b(std::string("evaluation-") + gate + "/run-1");
    a.add_stream("r0.main.t-main", evaluated_loop(0x10));
    b.add_stream("r0.main.t-main", evaluated_loop(0xc0));
    DiffOptions o;
    o.gate.fail_on = gate;
    DiffReport r;
    const Status s = diff_runs(a.path(), b.path(), o, &r);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(r.verdict, Verdict::kDivergent);
    ASSERT_TRUE(r.first.has_value());
    EXPECT_EQ(r.first->step, 0u);
    EXPECT_EQ(r.first->op, "aten::linear");
    EXPECT_EQ(r.first->evidence.outputs.at(0).tensor_role, TensorRole::kEvaluation);
    EXPECT_TRUE(r.training.identical);
    EXPECT_NE(r.first->explanation.cause.find("an evaluation's, computed with autograd off"),
              std::string::npos)
        << r.first->explanation.cause;
    EXPECT_EQ(gate_exit_code(r),
              std::string(gate) == "training" ? ExitCode::kIdentical : ExitCode::kDivergent);
  }
}

TEST(RolesTest, ADifferenceReachesTrainingThroughTheOpsThatReadIt) {
  // A value that reaches the optimizer only through two forward ops after it.
  TraceBuilder t;
  t.step(0);
  const int64_t x = t.op("aten::mul").in_new(external(0x01)).out_new(tensor(0x02)).done();
  const int64_t y = t.op("aten::relu").in_ref(x).out_new(tensor(0x03)).done();
  const int64_t z = t.op("aten::sum").in_ref(y).out_new(tensor(0x04, {})).done();
  t.op("aten::add_", Phase::kOptimizer)
      .in_new(external(0x05))
      .in_ref(z)
      .out_new(tensor(0x06))
      .done();
  t.end();
  Asked a = ask(t, 0, 0, 0b1);
  EXPECT_TRUE(a.outputs.at(0).reaches_training);
  EXPECT_EQ(a.outputs.at(0).role, TensorRole::kActivation);
}

TEST(RolesTest, EveryRoleHasItsWordAndTrainingStateIsTheOnesACheckpointCarries) {
  for (TensorRole role : {TensorRole::kParameter, TensorRole::kGradient,
                          TensorRole::kOptimizerState, TensorRole::kModelBuffer})
    EXPECT_TRUE(is_training_state(role)) << tensor_role_name(role);
  for (TensorRole role :
       {TensorRole::kBatch, TensorRole::kRandomDraw, TensorRole::kActivation,
        TensorRole::kEvaluation, TensorRole::kOutsideTraining, TensorRole::kUnknown})
    EXPECT_FALSE(is_training_state(role)) << tensor_role_name(role);
  EXPECT_STREQ(tensor_role_name(TensorRole::kOutsideTraining), "outside training");
  EXPECT_STREQ(tensor_role_name(TensorRole::kEvaluation), "evaluation");
  EXPECT_STREQ(tensor_role_name(TensorRole::kUnknown), "");
}

// Three steps: a linear, a loss summed for logging, its gradient, the weight's update. Run B's
// logged sum starts elsewhere (`sum_from`), or its gradient differs at step `grad_at`.
TraceBuilder logging_loop(uint8_t sum_from, int grad_at) {
  TraceBuilder t;
  int64_t weight = -1, sum = -1;
  bool moved = false;
  for (int step = 0; step < 3; ++step) {
    t.step(uint64_t(step));
    auto lin = t.op("aten::linear").in_new(external(uint8_t(0x20 + step)));
    if (weight < 0) {
      lin.in_new(external(0x40));
      weight = lin.last_id();
    } else {
      lin.in_ref(weight);
    }
    moved = moved || step == grad_at;
    const int64_t h = lin.out_new(tensor(uint8_t(0x50 + step + (moved ? 0x80 : 0)))).done();
    const int64_t loss = t.op("aten::sum")
                             .in_ref(h)
                             .out_new(tensor(uint8_t(0x70 + step + (moved ? 0x80 : 0)), {}))
                             .done();
    auto add = t.op("aten::add_");
    if (sum < 0) {
      add.in_new(external(sum_from, {}));
    } else {
      add.in_ref(sum);
    }
    sum = add.in_ref(loss)
              .out_new(tensor(uint8_t(sum_from + 0x10 * (step + 1) + (moved ? 0x80 : 0)), {}))
              .done();
    const int64_t grad = t.op("aten::mm", Phase::kBackward)
                             .in_ref(h)
                             .out_new(tensor(uint8_t(0x90 + step + (moved ? 0x80 : 0))))
                             .done();
    weight = t.op("aten::add_", Phase::kOptimizer)
                 .in_ref(weight)
                 .in_ref(grad)
                 .out_new(tensor(uint8_t(0x41 + step + (moved ? 0x80 : 0))))
                 .done();
  }
  t.end();
  return t;
}

DiffReport diff_loops(const std::string& name, uint8_t sum_from_b, int grad_at_b,
                      const std::string& fail_on) {
  RunDir a(name + "/run-0"), b(name + "/run-1");
  a.add_stream("r0.main.t-main", logging_loop(0x00, -1));
  b.add_stream("r0.main.t-main", logging_loop(sum_from_b, grad_at_b));
  DiffOptions o;
  o.gate.fail_on = fail_on;
  DiffReport r;
  const Status s = diff_runs(a.path(), b.path(), o, &r);
  EXPECT_TRUE(s.ok()) << s.message();
  return r;
}

TEST(RolesTest, ALoggedSumAloneDiffersAndTheTrainingGatePassesOnIt) {
  for (const char* gate : {"any", "training"}) {
    const DiffReport r = diff_loops(std::string("logged-") + gate, 0x01, -1, gate);
    ASSERT_EQ(r.verdict, Verdict::kDivergent);
    ASSERT_TRUE(r.first.has_value());
    EXPECT_EQ(r.first->step, 0u);
    EXPECT_EQ(r.first->op, "aten::add_");
    EXPECT_EQ(r.first->evidence.inputs.at(0).tensor_role, TensorRole::kOutsideTraining);
    EXPECT_TRUE(r.first->evidence.training.known);
    EXPECT_FALSE(r.first->evidence.training.reaches);
    EXPECT_TRUE(r.training.identical);
    EXPECT_EQ(r.training.divergent_writes, 0u);
    EXPECT_EQ(r.training.divergent_outside, 3u);  // the sum at each step
    EXPECT_EQ(r.training.writes_compared, 1u);    // the weight, a position of each step's writes
    EXPECT_NE(r.first->explanation.cause.find("reaches no parameter, gradient or optimizer state"),
              std::string::npos)
        << r.first->explanation.cause;
    EXPECT_EQ(gate_exit_code(r),
              std::string(gate) == "training" ? ExitCode::kIdentical : ExitCode::kDivergent);
  }
}

TEST(RolesTest, AGradientThatDiffersFailsTheTrainingGate) {
  const DiffReport r = diff_loops("gradient", 0x00, 1, "training");
  ASSERT_EQ(r.verdict, Verdict::kDivergent);
  ASSERT_TRUE(r.first.has_value());
  EXPECT_EQ(r.first->step, 1u);
  EXPECT_TRUE(r.first->evidence.training.reaches);
  EXPECT_FALSE(r.training.identical);
  EXPECT_GT(r.training.divergent_writes, 0u);
  EXPECT_EQ(gate_exit_code(r), ExitCode::kDivergent);
}

TEST(RolesTest, AMergedDiffOfPartsSaysTheTrainingStateAsTheWholeDiffDoes) {
  RunDir a("merged/run-0"), b("merged/run-1");
  a.add_stream("r0.main.t-main", logging_loop(0x00, -1));
  b.add_stream("r0.main.t-main", logging_loop(0x01, -1));
  DiffOptions o;
  o.gate.fail_on = "training";
  nlohmann::json part;
  ASSERT_TRUE(diff_part(a.path(), b.path(), o, &part).ok());
  DiffReport r;
  const Status s = merge_parts({part}, {"part.json"}, o, &r);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(r.verdict, Verdict::kDivergent);
  ASSERT_TRUE(r.first.has_value());
  EXPECT_EQ(r.first->evidence.inputs.at(0).tensor_role, TensorRole::kOutsideTraining);
  EXPECT_TRUE(r.training.identical);
  EXPECT_EQ(r.training.divergent_outside, 3u);
  EXPECT_EQ(gate_exit_code(r), ExitCode::kIdentical);
}

// A value passed to an op is named by where it goes: into the weight's update (a learning rate
// changed at step 1) it is a hyperparameter; into an activation, a Python value drawn unseeded.
TraceBuilder scaled_loop(double lr_at_1, double scale_at_1) {
  TraceBuilder t;
  int64_t weight = -1;
  for (uint64_t step = 0; step < 2; ++step) {
    t.step(step);
    auto lin = t.op("aten::linear").in_new(external(uint8_t(0x20 + step)));
    weight < 0 ? lin.in_new(external(0x40)) : lin.in_ref(weight);
    const int64_t h = lin.out_new(tensor(uint8_t(0x50 + step))).done();
    const bool scaled = step == 1 && scale_at_1 != 0.5;
    const int64_t y = t.op("aten::mul")
                          .in_ref(h)
                          .in_double(step == 1 ? scale_at_1 : 0.5)
                          .out_new(tensor(uint8_t(scaled ? 0x5f : 0x58 + step)))
                          .done();
    const int64_t grad =
        t.op("aten::mm", Phase::kBackward).in_ref(y).out_new(tensor(uint8_t(0x90 + step))).done();
    const double lr = step == 1 ? lr_at_1 : -0.1;
    const bool moved = step == 1 && (lr_at_1 != -0.1 || scaled);
    weight = t.op("aten::add_", Phase::kOptimizer)
                 .in_ref(weight < 0 ? lin.last_id() : weight)
                 .in_ref(grad)
                 .in_double(lr)
                 .out_new(tensor(uint8_t(moved ? 0x4f : 0x41 + step)))
                 .done();
  }
  t.end();
  return t;
}

std::string scalar_cause(const std::string& name, double lr_at_1, double scale_at_1) {
  RunDir a(name + "/run-0"), b(name + "/run-1");
  a.add_stream("r0.main.t-main", scaled_loop(-0.1, 0.5));
  b.add_stream("r0.main.t-main", scaled_loop(lr_at_1, scale_at_1));
  DiffReport r;
  EXPECT_TRUE(diff_runs(a.path(), b.path(), DiffOptions{}, &r).ok());
  EXPECT_TRUE(r.first);
  return r.first ? r.first->explanation.cause : "";
}

TEST(RolesTest, AValuePassedToAParametersUpdateIsAHyperparameter) {
  const std::string lr = scalar_cause("scalar_lr", -0.11, 0.5);
  EXPECT_EQ(lr.rfind("a hyperparameter differs (-0.10000000000000001 vs -0.11)", 0), 0u) << lr;
  EXPECT_NE(lr.find("writes the parameter"), std::string::npos) << lr;
  const std::string drawn = scalar_cause("scalar_drawn", -0.1, 0.75);
  EXPECT_EQ(drawn.rfind("a Python value passed to the op differs (0.5 vs 0.75)", 0), 0u) << drawn;
}

}  // namespace
}  // namespace detaudit
