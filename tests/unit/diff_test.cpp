// The comparator on synthesized runs: each divergence class at the right op and step, the
// alignment, the environment, truncated and corrupt input, the gate and the report formats.
#include "diff/diff.h"

#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "catalog/catalog.h"
#include "diff/op_source.h"
#include "diff/partial.h"
#include "diff/replicas.h"
#include "diff/report_model.h"
#include "report/render.h"
#include "report_printers.h"
#include "test_files.h"
#include "trace_builder.h"

namespace detaudit {

namespace {

using namespace detaudit::testing;

// A small training loop; the fields say where run B departs from run A.
struct Scenario {
  int steps = 3;
  uint64_t threads = 2;
  int nondet_step = -1;    // _index_put_impl_ gives a different output, same inputs
  int rng_step = -1;       // bernoulli_ sees a different generator state
  int external_step = -1;  // the batch entering the program differs
  int uninit_step = -1;    // an op reads the empty buffer
  int insert_step = -1;    // run B runs an extra aten::relu
  int extra_steps = 0;     // run B runs more steps
  bool accumulate = true;
  double grad_stats_delta = 0;  // run B's gradient statistics differ by this much
};

TraceBuilder build(const Scenario& s, bool b) {
  TraceBuilder t;
  int64_t w = t.op("aten::ones").out_new(tensor(0x01)).done();
  bool params_diverged = false;
  int steps = s.steps + (b ? s.extra_steps : 0);
  for (int k = 0; k < steps; ++k) {
    bool here = b;  // run B differs at the scenario's step
    t.step(uint64_t(k), 7 + uint64_t(k), s.threads);
    // The empty family: contents differ run to run, and that is not a divergence.
    int64_t e = t.op("aten::empty").in_int(16).out_new(uninitialized(b ? 0xEE : 0x11)).done();
    if (k == s.uninit_step)
      t.op("aten::add").in_ref(e).in_int(1).out_new(tensor(uint8_t(here ? 0xEF : 0x12))).done();
    // linear > addmm, written inner first.
    uint64_t o = t.reserve_orders(2);
    uint8_t batch = uint8_t(0x20 + k + (here && k == s.external_step ? 0x40 : 0));
    uint8_t y = uint8_t(batch + 1 + (params_diverged ? 0x10 : 0));
    TensorDesc ty = tensor(y);
    if (b && s.grad_stats_delta != 0 && k > 0) ty.digest[2] ^= 1;  // digest only: same stats
    auto addmm = t.op("aten::addmm", Phase::kForward, 1, int64_t(o + 1));
    addmm.in_new(tensor(batch, {4, 4}, Provenance::kExternal));
    int64_t x = addmm.last_id();
    addmm.in_ref(w).out_new(ty).done();
    int64_t out =
        t.op("aten::linear", Phase::kForward, 0, int64_t(o)).in_ref(x).in_ref(w).out_new(ty).done();
    if (b && k == s.insert_step) t.op("aten::relu").in_ref(out).out_new(tensor(0x77)).done();
    uint64_t rng = 100 + uint64_t(k) + (here && k == s.rng_step ? 1000 : 0);
    t.op("aten::bernoulli_")
        .random(rng)
        .in_new(tensor(0x30))
        .in_double(0.5)
        .in_none()
        .out_new(tensor(uint8_t(rng)))
        .done();
    // Backward: IndexBackward0 > aten::index_put_ > aten::_index_put_impl_.
    o = t.reserve_orders(3);
    bool nd = here && k == s.nondet_step;
    TensorDesc grad = tensor(uint8_t(0x50 + k + (nd ? 0x80 : 0)), {65536});
    if (here) grad.stats.mean += s.grad_stats_delta;
    if (here && s.grad_stats_delta != 0) grad.digest[0] ^= 1;
    auto impl = t.op("aten::_index_put_impl_", Phase::kBackward, 2, int64_t(o + 2));
    impl.in_new(tensor(0, {65536}));
    int64_t self = impl.last_id();
    impl.in_list(1).in_new(tensor(0x40, {65536}, Provenance::kOutput, Dtype::kInt64));
    int64_t idx = impl.last_id();
    impl.in_new(tensor(0x41, {65536}));
    int64_t vals = impl.last_id();
    int64_t g = impl.in_bool(s.accumulate).in_bool(false).out_new(grad).done();
    t.op("aten::index_put_", Phase::kBackward, 1, int64_t(o + 1))
        .in_ref(self)
        .in_list(1)
        .in_ref(idx)
        .in_ref(vals)
        .in_bool(s.accumulate)
        .out_ref(g)
        .done();
    t.op("IndexBackward0", Phase::kBackward, 0, int64_t(o), Scope::kBackwardFunction)
        .in_ref(vals)
        .out_ref(g)
        .done();
    // Optimizer: one in-place update per parameter.
    if (nd || (here && k == s.rng_step)) params_diverged = true;
    TensorDesc p = tensor(uint8_t(0x60 + k + (params_diverged ? 0x20 : 0)));
    if (here && s.grad_stats_delta != 0) p.digest[1] ^= 1;  // a last-bit change
    w = t.op("aten::add_", Phase::kOptimizer).in_ref(w).in_ref(g).in_double(-0.1).out_new(p).done();
  }
  t.end();
  return t;
}

struct Case {
  RunDir a, b;
  Case(const std::string& name, const Scenario& s) : a(name + "/run-0"), b(name + "/run-1") {
    a.add_stream("r0.main.t0", build(s, false));
    b.add_stream("r0.main.t0", build(s, true));
  }
};

DiffReport diff(const Case& c, GateConfig gate = {}) {
  DiffOptions o;
  o.catalog = &shipped_catalog();
  o.gate = gate;
  DiffReport r;
  Status s = diff_runs(c.a.path(), c.b.path(), o, &r);
  EXPECT_TRUE(s.ok()) << s.message();
  return r;
}

TEST(DiffTest, IdenticalRunsWithDifferentUninitializedOutputs) {
  Case c("identical", Scenario{});
  DiffReport r = diff(c);
  EXPECT_EQ(r.verdict, Verdict::kIdentical);
  EXPECT_FALSE(r.first.has_value());
  EXPECT_GT(r.ops_compared, 20u);
  EXPECT_EQ(gate_exit_code(r), ExitCode::kIdentical);
}

TEST(DiffTest, NondeterministicOpWithCatalogEntry) {
  Scenario s;
  s.nondet_step = 1;
  Case c("nondet", s);
  DiffReport r = diff(c);
  ASSERT_EQ(r.verdict, Verdict::kDivergent);
  ASSERT_TRUE(r.first);
  const FirstDivergence& f = *r.first;
  EXPECT_EQ(f.divergence_class, DivergenceClass::kNondeterministicOp);
  EXPECT_EQ(f.op, "aten::_index_put_impl_");
  EXPECT_EQ(f.step, 1u);
  EXPECT_EQ(f.phase, "backward");
  EXPECT_EQ(f.chain, (std::vector<std::string>{"IndexBackward0", "aten::index_put_",
                                               "aten::_index_put_impl_"}));
  ASSERT_TRUE(f.explanation.catalog);
  EXPECT_EQ(f.explanation.catalog->id, "index-put-accumulate-cpu");
  EXPECT_FALSE(f.explanation.remedy.empty());
  EXPECT_EQ(gate_exit_code(r), ExitCode::kDivergent);
  // Spread: the gradient ops of step 1, then the parameter from step 1 on.
  EXPECT_EQ(r.divergent_ops_per_step.count(0), 0u);
  EXPECT_GE(r.divergent_ops_per_step[1], 3u);
  ASSERT_EQ(r.parameters.size(), 1u);
  EXPECT_EQ(r.parameters[0].first_step, 1u);
  ASSERT_FALSE(f.evidence.magnitude.empty());
  EXPECT_TRUE(f.evidence.magnitude[0].has_stats);
}

// Two sentinel runs of format 9: per step, the loss and the optimizer step's state record (its
// gradients in, its parameters out). B's differ from step 2 on: in the gradients, or in the
// update alone.
Case sentinel_case(const std::string& name, bool gradients_differ) {
  Case c(name, Scenario{});
  for (int side = 0; side < 2; ++side) {
    TraceBuilder b;
    for (uint64_t step = 0; step < 4; ++step) {
      b.step(step);
      const uint8_t late = side == 1 && step >= 2 ? 100 : 0;
      b.op("aten::cross_entropy_loss").out_new(tensor(uint8_t(1 + step), {})).done();
      b.op("Optimizer.step#SGD.step", Phase::kOptimizer, 0, -1, Scope::kOther)
          .in_list(2)
          .in_new(tensor(uint8_t(10 + step + (gradients_differ ? late : 0)), {4},
                         Provenance::kExternal))
          .in_new(tensor(uint8_t(20 + step), {4, 4}, Provenance::kExternal))
          .out_list(2)
          .out_new(tensor(uint8_t(30 + step + late), {4}))
          .out_new(tensor(uint8_t(40 + step + late), {4, 4}))
          .done();
    }
    b.end();
    RunDir& run = side ? c.b : c.a;
    std::filesystem::remove_all(run.path() + "/streams");
    std::filesystem::create_directories(run.path() + "/streams");
    run.add_stream("r0.main.t0", b);
    RunDir::write(run.path() + "/config.json", R"({"record": {"sentinel": true}})");
  }
  return c;
}

TEST(DiffTest, ASentinelsStepStateRecordNamesItsStepAndWhichHalfDiffers) {
  for (bool gradients_differ : {false, true}) {
    Case c = sentinel_case(gradients_differ ? "state_gradients" : "state_update", gradients_differ);
    DiffReport r = diff(c);
    ASSERT_EQ(r.verdict, Verdict::kDivergent);
    ASSERT_TRUE(r.first);
    const FirstDivergence& f = *r.first;
    EXPECT_EQ(f.op, "Optimizer.step#SGD.step");
    EXPECT_EQ(f.step, 2u);
    EXPECT_EQ(f.divergence_class, DivergenceClass::kStepLevel);
    EXPECT_EQ(f.evidence.detail,
              gradients_differ ? "step 2's gradients differ (what its optimizer step read)"
                               : "step 2's optimizer update differs: the same gradients in, other "
                                 "parameters or state out");
    EXPECT_NE(f.explanation.remedy.find("--steps 1-2"), std::string::npos) << f.explanation.remedy;
    // Each tensor the step leaves is a parameter, first divergent at step 2 (the first
    // divergence's own step, though later steps' differences were open before it settled).
    ASSERT_EQ(r.parameters.size(), 2u);
    for (const auto& p : r.parameters) EXPECT_EQ(p.first_step, 2u) << p.position;
  }
}

TEST(DiffTest, AccumulateFalseIsNotTheCpuAtomicsEntry) {
  Scenario s;
  s.nondet_step = 0;
  s.accumulate = false;
  Case c("nondet_noacc", s);
  DiffReport r = diff(c);
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kNondeterministicOp);
  EXPECT_TRUE(!r.first->explanation.catalog ||
              r.first->explanation.catalog->id != "index-put-accumulate-cpu");
}

TEST(DiffTest, RngState) {
  Scenario s;
  s.rng_step = 2;
  Case c("rng", s);
  DiffReport r = diff(c);
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kRngState);
  EXPECT_EQ(r.first->op, "aten::bernoulli_");
  EXPECT_EQ(r.first->step, 2u);
  EXPECT_NE(r.first->evidence.rng_a, r.first->evidence.rng_b);
}

TEST(DiffTest, PythonHashSeedIsNotNamedAsTheRngCause) {
  Scenario s;
  s.rng_step = 1;
  Case c("rng_hashseed", s);
  nlohmann::json ea = sample_env(2, 11), eb = sample_env(2, 22);
  ea["env"]["PYTHONHASHSEED"] = "0";
  eb["env"]["PYTHONHASHSEED"] = "1";
  c.a.env("r0.main", ea);
  c.b.env("r0.main", eb);
  DiffReport r = diff(c);
  ASSERT_TRUE(r.first);
  ASSERT_EQ(r.first->divergence_class, DivergenceClass::kRngState);
  EXPECT_EQ(r.first->explanation.cause.find("PYTHONHASHSEED"), std::string::npos)
      << r.first->explanation.cause;
}

TEST(DiffTest, ExternalInput) {
  Scenario s;
  s.external_step = 1;
  Case c("external", s);
  DiffReport r = diff(c);
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kExternalInput);
  EXPECT_EQ(r.first->op, "aten::addmm");
  EXPECT_EQ(r.first->chain, (std::vector<std::string>{"aten::linear", "aten::addmm"}));
  EXPECT_EQ(r.first->step, 1u);
  ASSERT_FALSE(r.first->evidence.inputs.empty());
  EXPECT_TRUE(r.first->evidence.inputs[0].differs);
  EXPECT_EQ(r.first->evidence.inputs[0].a.provenance, "external");
}

TEST(DiffTest, UninitializedMemory) {
  Scenario s;
  s.uninit_step = 1;
  Case c("uninit", s);
  DiffReport r = diff(c);
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kUninitializedMemory);
  EXPECT_EQ(r.first->op, "aten::add");
  EXPECT_EQ(r.first->step, 1u);
}

TEST(DiffTest, InsertedOpIsStructuralAndLaterOpsAreStillCompared) {
  Scenario s;
  s.insert_step = 1;
  s.nondet_step = 2;
  Case c("inserted", s);
  DiffReport r = diff(c);
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kStructural);
  EXPECT_EQ(r.first->step, 1u);
  EXPECT_EQ(r.structural_count, 1u);
  ASSERT_EQ(r.structural.size(), 1u);
  EXPECT_EQ(r.structural[0].op_b, "aten::relu");
  EXPECT_EQ(r.structural[0].skipped_a, 0u);
  EXPECT_EQ(r.structural[0].skipped_b, 1u);
  // After realignment the step-2 divergence is still found.
  EXPECT_GE(r.divergent_ops_per_step[2], 3u);
  EXPECT_EQ(r.divergent_ops_per_step.count(1), 0u);
}

TEST(DiffTest, ExtraStepIsStructuralAtItsPosition) {
  Scenario s;
  s.extra_steps = 1;
  Case c("extra_step", s);
  DiffReport r = diff(c);
  EXPECT_EQ(r.verdict, Verdict::kDivergent);
  ASSERT_EQ(r.structural.size(), 1u);
  EXPECT_EQ(r.structural[0].step, 3u);
  EXPECT_GT(r.structural[0].skipped_b, 0u);
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kStructural);
  EXPECT_EQ(r.first->step, 3u);
}

TEST(DiffTest, StreamInOneRunOnly) {
  Case c("lonely", Scenario{});
  c.b.add_stream("r0.main.t1", build(Scenario{}, false));
  DiffReport r = diff(c);
  // Nothing to compare it with: not a divergence, but not a pass either (fail closed).
  EXPECT_EQ(r.verdict, Verdict::kIncomplete);
  EXPECT_EQ(gate_exit_code(r), ExitCode::kIncomplete);
  EXPECT_EQ(r.structural_count, 0u);
  EXPECT_FALSE(r.first);
  ASSERT_EQ(r.not_compared.size(), 1u);
  EXPECT_NE(r.not_compared[0].find("stream r0.main.t1 is only in run B"), std::string::npos)
      << r.not_compared[0];
  r.gate.allow_truncated = true;
  EXPECT_EQ(gate_exit_code(r), ExitCode::kIdentical);
}

TEST(DiffTest, ThreadCountDifferenceIsNamedAsCause) {
  Scenario s;
  s.nondet_step = 0;
  s.accumulate = false;  // no catalog entry: the cause must come from the environment
  Case c("threads", s);
  c.a.env("r0.main", sample_env(1, 11));
  c.b.env("r0.main", sample_env(2, 22));
  DiffReport r = diff(c);
  ASSERT_FALSE(r.environment.empty());
  EXPECT_EQ(r.environment[0].key, "intra_op_threads");
  for (const EnvDifference& d : r.environment) EXPECT_NE(d.key, "pid");
  ASSERT_TRUE(r.first);
  EXPECT_NE(r.first->explanation.cause.find("intra_op_threads differs: 1 vs 2"), std::string::npos)
      << r.first->explanation.cause;
}

TEST(DiffTest, IdenticalEnvironmentsGiveNoDifferences) {
  Case c("same_env", Scenario{});
  c.a.env("r0.main", sample_env(2, 11));
  c.b.env("r0.main", sample_env(2, 22));
  DiffReport r = diff(c);
  EXPECT_TRUE(r.environment.empty());
}

TEST(DiffTest, TruncatedStreamIsComparedUpToTheCut) {
  Scenario s;
  Case c("truncated", s);
  std::string bytes = build(s, true).bytes();
  c.b.add_bytes("r0.main.t0", bytes.substr(0, bytes.size() * 2 / 3));
  DiffReport r = diff(c);
  ASSERT_EQ(r.truncated.size(), 1u);
  EXPECT_EQ(r.truncated[0].run, "b");
  EXPECT_EQ(r.truncated[0].file, c.b.stream_path("r0.main.t0"));
  EXPECT_GT(r.truncated[0].offset, 0u);
  EXPECT_GT(r.truncated[0].ops_compared, 5u);
  // What could be compared matched, but the rest of run A was not: the gate fails closed.
  EXPECT_EQ(r.verdict, Verdict::kIncomplete);
  EXPECT_EQ(gate_exit_code(r), ExitCode::kIncomplete);
  ASSERT_EQ(r.not_compared.size(), 1u);
  EXPECT_NE(r.not_compared[0].find("run B stream r0.main.t0 was cut short"), std::string::npos)
      << r.not_compared[0];
  nlohmann::json j = nlohmann::json::parse(render_report(r, ReportFormat::kJson, false));
  EXPECT_TRUE(j["truncated"].is_object());
  EXPECT_EQ(j["verdict"], "incomplete");
  EXPECT_EQ(j["exit_code"], 5);

  // Allowed, it passes on what both runs have.
  DiffOptions o;
  o.catalog = &shipped_catalog();
  o.gate.allow_truncated = true;
  ASSERT_TRUE(diff_runs(c.a.path(), c.b.path(), o, &r).ok());
  EXPECT_EQ(r.verdict, Verdict::kIdentical);
  EXPECT_TRUE(r.incomplete);
  EXPECT_EQ(gate_exit_code(r), ExitCode::kIdentical);

  // A divergence before the cut is still a divergence.
  Scenario nd;
  nd.nondet_step = 0;
  Case d("truncated_divergent", nd);
  std::string cut = build(nd, true).bytes();
  d.b.add_bytes("r0.main.t0", cut.substr(0, cut.size() * 2 / 3));
  EXPECT_EQ(gate_exit_code(diff(d)), ExitCode::kDivergent);
}

// Both runs killed at the same op: nothing differs, but neither run is whole.
TEST(DiffTest, StreamsWithoutEndRecordAreIncomplete) {
  RunDir a("noend/run-0"), b("noend/run-1");
  TraceBuilder t;  // no end(): the process never closed its stream
  t.step(0);
  for (int k = 0; k < 4; ++k) t.op("aten::relu").in_new(tensor(0x30)).out_new(tensor(0x31)).done();
  a.add_stream("r0.main.t0", t);
  b.add_stream("r0.main.t0", t);
  DiffOptions o;
  DiffReport r;
  ASSERT_TRUE(diff_runs(a.path(), b.path(), o, &r).ok());
  EXPECT_EQ(r.verdict, Verdict::kIncomplete);
  EXPECT_EQ(gate_exit_code(r), ExitCode::kIncomplete);
  ASSERT_EQ(r.not_compared.size(), 1u) << r.not_compared.size();
  EXPECT_NE(r.not_compared[0].find("no END record in run A nor B"), std::string::npos)
      << r.not_compared[0];
}

TEST(DiffTest, CorruptStreamIsAnErrorNamingFileAndOffset) {
  Scenario s;
  Case c("corrupt", s);
  std::string bytes = build(s, true).bytes();
  bytes[bytes.size() / 2] ^= 0x5a;
  c.b.add_bytes("r0.main.t0", bytes);
  DiffOptions o;
  DiffReport r;
  Status st = diff_runs(c.a.path(), c.b.path(), o, &r);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ExitCode::kBadInput);
  EXPECT_NE(st.message().find(c.b.stream_path("r0.main.t0")), std::string::npos);
  EXPECT_NE(st.message().find("offset"), std::string::npos);
}

// A run recorded with another digest is not a divergence at every tensor: it is refused.
TEST(DiffTest, StreamsRecordedWithDifferentDigestsAreNotCompared) {
  RunDir a("digests/run-0"), b("digests/run-1");
  for (auto [dir, algo] :
       {std::pair{&a, trace::DigestAlgo::kMd5}, {&b, trace::DigestAlgo::kDevice}}) {
    TraceBuilder t(0, "main", "main", algo);
    t.step(0);
    t.op("aten::add").in_int(1).in_int(2).done();
    t.end();
    dir->add_stream("r0.main.t0", t);
  }
  DiffOptions o;
  DiffReport r;
  Status st = diff_runs(a.path(), b.path(), o, &r);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ExitCode::kBadInput);
  EXPECT_NE(st.message().find("md5 digest"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("device digest"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("--digest"), std::string::npos) << st.message();

  // The same digest on both sides: compared, and the report names it per stream.
  RunDir c("digests/run-2");
  TraceBuilder t(0, "main", "main", trace::DigestAlgo::kDevice);
  t.step(0);
  t.op("aten::add").in_int(1).in_int(2).done();
  t.end();
  c.add_stream("r0.main.t0", t);
  ASSERT_TRUE(diff_runs(b.path(), c.path(), o, &r).ok());
  ASSERT_EQ(r.streams.size(), 1u);
  EXPECT_EQ(r.streams[0].digest, "device");
  EXPECT_NE(render_report(r, ReportFormat::kText, false).find("(digest: device)"),
            std::string::npos);
  EXPECT_NE(render_report(r, ReportFormat::kMarkdown, false).find("(digest: device)"),
            std::string::npos);
  EXPECT_NE(render_report(r, ReportFormat::kHtml, false).find("<td>device</td>"),
            std::string::npos);
}

TEST(DiffTest, MissingRunDirectoryIsBadInput) {
  DiffOptions o;
  DiffReport r;
  Status st = diff_runs("/nonexistent/run-0", "/nonexistent/run-1", o, &r);
  EXPECT_EQ(st.code(), ExitCode::kBadInput);
}

TEST(DiffTest, ToleranceGate) {
  Scenario s;
  s.grad_stats_delta = 1e-6;
  Case c("tolerance", s);
  GateConfig loose{"tolerance", 0, 1e-3};
  DiffReport r = diff(c, loose);
  EXPECT_EQ(r.verdict, Verdict::kDivergent);
  EXPECT_FALSE(r.beyond_tolerance);
  EXPECT_EQ(gate_exit_code(r), ExitCode::kIdentical);
  GateConfig tight{"tolerance", 0, 1e-9};
  EXPECT_EQ(gate_exit_code(diff(c, tight)), ExitCode::kDivergent);
  EXPECT_EQ(gate_exit_code(diff(c, GateConfig{})), ExitCode::kDivergent);
}

TEST(DiffTest, StructuralDifferencesFailTheToleranceGate) {
  Scenario s;
  s.insert_step = 0;
  Case c("tolerance_structural", s);
  EXPECT_EQ(gate_exit_code(diff(c, GateConfig{"tolerance", 1, 1})), ExitCode::kDivergent);
}

// torch.tensor(list) in 1.13: aten::empty, then the list's values written without an op, then
// aten::detach_ on the (uninitialized-marked) buffer, whose output shows what was written.
TraceBuilder filled_buffer(uint8_t garbage, uint8_t written, bool passes_through = true) {
  TraceBuilder t;
  t.step(0);
  int64_t e = t.op("aten::empty").in_int(8).out_new(uninitialized(garbage, {8})).done();
  TensorDesc out = tensor(written, {8});
  t.op(passes_through ? "aten::detach_" : "aten::add").in_ref(e).out_new(out).done();
  for (int k = 0; k < 4; ++k) t.op("aten::relu").in_new(tensor(0x30)).out_new(tensor(0x31)).done();
  t.end();
  return t;
}

TEST(DiffTest, EmptyBufferFilledOutsideRecordedOpsIsExternalInput) {
  RunDir a("filled/run-0"), b("filled/run-1");
  a.add_stream("r0.main.t0", filled_buffer(0x11, 0x21));
  b.add_stream("r0.main.t0", filled_buffer(0xEE, 0x22));
  DiffReport r;
  DiffOptions o;
  ASSERT_TRUE(diff_runs(a.path(), b.path(), o, &r).ok());
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->op, "aten::detach_");
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kExternalInput) << r.first->evidence.detail;
  EXPECT_NE(r.first->evidence.detail.find("filled outside the recorded ops"), std::string::npos);
}

// What the recorder writes for torch.compile: the region's record (its inputs), then a reader
// of the region's output, which the recorder first sees there (provenance "compiled").
TraceBuilder compiled_step(uint8_t region_output, uint8_t state) {
  TraceBuilder t;
  t.step(0);
  t.op("aten::clone")
      .in_new(tensor(state, {5056}, Provenance::kExternal, Dtype::kUInt8))
      .out_new(tensor(state, {5056}, Provenance::kOutput, Dtype::kUInt8))
      .done();
  t.op("CompiledFunction").compiled_region().in_new(tensor(0x31)).done();
  t.op("aten::mse_loss")
      .in_new(tensor(region_output, {4, 4}, Provenance::kCompiled))
      .in_new(tensor(0x32))
      .out_new(tensor(uint8_t(region_output + 1), {}))
      .done();
  t.end();
  return t;
}

TEST(DiffTest, DifferenceMadeInsideACompiledRegionIsLocalizedToIt) {
  RunDir a("compiled/run-0"), b("compiled/run-1");
  a.add_stream("r0.main.t0", compiled_step(0x40, 0x01));
  b.add_stream("r0.main.t0", compiled_step(0x41, 0x01));
  DiffReport r;
  DiffOptions o;
  o.catalog = &shipped_catalog();
  ASSERT_TRUE(diff_runs(a.path(), b.path(), o, &r).ok());
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->op, "aten::mse_loss");
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kNondeterministicOp)
      << r.first->evidence.detail;
  EXPECT_EQ(r.first->evidence.compiled_region, "CompiledFunction");
  EXPECT_TRUE(r.first->evidence.arose_in_compiled_region);
  EXPECT_FALSE(r.first->explanation.catalog)
      << "the reader's catalog entry would explain the wrong kernel";
  EXPECT_NE(r.first->explanation.remedy.find("TORCHDYNAMO_DISABLE=1"), std::string::npos);
  ASSERT_EQ(r.streams.size(), 1u);
  EXPECT_EQ(r.streams[0].compiled_regions, std::vector<std::string>{"CompiledFunction"});
}

TEST(DiffTest, ADifferentGeneratorStateIsRngState) {
  RunDir a("rngstate/run-0"), b("rngstate/run-1");
  a.add_stream("r0.main.t0", compiled_step(0x40, 0x01));
  b.add_stream("r0.main.t0", compiled_step(0x40, 0x02));
  DiffReport r;
  DiffOptions o;
  ASSERT_TRUE(diff_runs(a.path(), b.path(), o, &r).ok());
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->op, "aten::clone");
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kRngState) << r.first->evidence.detail;
  EXPECT_NE(r.first->evidence.detail.find("get_rng_state"), std::string::npos);
}

TEST(DiffTest, UninitializedValuesPassedThroughStayUninitializedMemory) {
  // detach_ returns the garbage it was given (same digest as its input): a real read of
  // uninitialized memory, not a buffer filled from outside.
  RunDir a("garbage/run-0"), b("garbage/run-1");
  a.add_stream("r0.main.t0", filled_buffer(0x11, 0x11));
  b.add_stream("r0.main.t0", filled_buffer(0xEE, 0xEE));
  DiffReport r;
  ASSERT_TRUE(diff_runs(a.path(), b.path(), DiffOptions{}, &r).ok());
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kUninitializedMemory);
  // And an op that computes from the buffer is a read, whatever its output.
  RunDir c("garbage_add/run-0"), d("garbage_add/run-1");
  c.add_stream("r0.main.t0", filled_buffer(0x11, 0x21, false));
  d.add_stream("r0.main.t0", filled_buffer(0xEE, 0x22, false));
  ASSERT_TRUE(diff_runs(c.path(), d.path(), DiffOptions{}, &r).ok());
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kUninitializedMemory);
}

// x.sum() over a large tensor: with 2 threads the reduction allocates and copies per-thread
// partials (two extra ops inside aten::sum), and the sum's bits change.
TraceBuilder parallel_sum(uint64_t threads) {
  TraceBuilder t;
  t.step(0, 7, threads);
  int64_t x = t.op("aten::randn").in_int(1 << 20).out_new(tensor(0x01, {1 << 20})).done();
  uint64_t o = t.reserve_orders(threads > 1 ? 4 : 2);
  if (threads > 1) {
    int64_t buf = t.op("aten::empty", Phase::kForward, 2, int64_t(o + 2))
                      .out_new(uninitialized(0x02, {2, 1}))
                      .done();
    t.op("aten::copy_", Phase::kForward, 2, int64_t(o + 3))
        .in_ref(buf)
        .in_new(tensor(0, {1, 1}))
        .out_new(tensor(0, {2, 1}))
        .done();
  }
  TensorDesc sum = tensor(uint8_t(0x10 + threads), {});
  int64_t s = t.op("aten::sum", Phase::kForward, 1, int64_t(o + 1)).in_ref(x).out_new(sum).done();
  t.op("aten::sum", Phase::kForward, 0, int64_t(o)).in_ref(x).out_ref(s).done();
  for (int k = 0; k < 4; ++k)
    t.op("aten::mul").in_ref(s).in_double(2).out_new(tensor(uint8_t(0x20 + threads), {})).done();
  t.end();
  return t;
}

TEST(DiffTest, KernelInternalOpsDifferingWithTheThreadCountNameTheThreads) {
  RunDir a("par_sum/run-0"), b("par_sum/run-1");
  a.add_stream("r0.main.t0", parallel_sum(1));
  b.add_stream("r0.main.t0", parallel_sum(2));
  a.env("r0.main", sample_env(1, 11));
  b.env("r0.main", sample_env(2, 22));
  DiffReport r;
  ASSERT_TRUE(diff_runs(a.path(), b.path(), DiffOptions{}, &r).ok());
  ASSERT_TRUE(r.first);
  const FirstDivergence& f = *r.first;
  EXPECT_EQ(f.divergence_class, DivergenceClass::kStructural);
  EXPECT_TRUE(f.evidence.nested);
  EXPECT_EQ(f.chain, (std::vector<std::string>{"aten::sum", "aten::sum", "aten::empty"}));
  EXPECT_NE(f.explanation.cause.find("intra_op_threads differs: 1 vs 2"), std::string::npos)
      << f.explanation.cause;
  EXPECT_NE(f.explanation.remedy.find("thread"), std::string::npos) << f.explanation.remedy;
  EXPECT_EQ(r.structural_count, 1u);
  EXPECT_GE(r.divergent_ops, 2u);  // the sums and what follows are still compared
}

TEST(DiffTest, TopLevelStructuralDifferenceDoesNotBlameTheThreads) {
  Scenario s;
  s.insert_step = 1;  // run B runs an extra top-level aten::relu
  Case c("inserted_threads", s);
  c.a.env("r0.main", sample_env(1, 11));
  c.b.env("r0.main", sample_env(2, 22));
  DiffReport r = diff(c);
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kStructural);
  EXPECT_FALSE(r.first->evidence.nested);
  EXPECT_EQ(r.first->explanation.cause.find("intra_op_threads"), std::string::npos)
      << r.first->explanation.cause;
}

TEST(DiffTest, StructuralDetailNamesTheOutermostExtraOps) {
  // Run B runs an extra linear (copy_ < addmm < linear, written inner first) and a tanh.
  auto build_branch = [](bool b) {
    TraceBuilder t;
    t.step(0);
    int64_t x = t.op("aten::randn").out_new(tensor(0x01)).done();
    if (b) {
      uint64_t o = t.reserve_orders(3);
      t.op("aten::copy_", Phase::kForward, 2, int64_t(o + 2))
          .in_ref(x)
          .out_new(tensor(0x40))
          .done();
      t.op("aten::addmm", Phase::kForward, 1, int64_t(o + 1))
          .in_ref(x)
          .out_new(tensor(0x41))
          .done();
      t.op("aten::linear", Phase::kForward, 0, int64_t(o)).in_ref(x).out_new(tensor(0x41)).done();
      t.op("aten::tanh").in_ref(x).out_new(tensor(0x42)).done();
    }
    for (int k = 0; k < 5; ++k) t.op("aten::relu").in_ref(x).out_new(tensor(0x50)).done();
    t.end();
    return t;
  };
  RunDir a("branch/run-0"), b("branch/run-1");
  a.add_stream("r0.main.t0", build_branch(false));
  b.add_stream("r0.main.t0", build_branch(true));
  DiffReport r;
  ASSERT_TRUE(diff_runs(a.path(), b.path(), DiffOptions{}, &r).ok());
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->chain,
            (std::vector<std::string>{"aten::linear", "aten::addmm", "aten::copy_"}));
  ASSERT_EQ(r.structural.size(), 1u);
  EXPECT_EQ(r.structural[0].skipped_b, 4u);
  EXPECT_NE(r.structural[0].detail.find("outermost: aten::linear, aten::tanh"), std::string::npos)
      << r.structural[0].detail;
  EXPECT_EQ(r.divergent_ops, 0u);
}

TEST(DiffTest, RunDirectoryWithoutTracesIsBadInputNotIdentical) {
  RunDir a("no_traces/run-0"), b("no_traces/run-1");
  {
    std::ofstream(a.path() + "/streams/r0.main.status") << "not attached: libtorch not loaded\n";
    std::ofstream(b.path() + "/streams/r0.main.status") << "not attached: libtorch not loaded\n";
  }
  DiffReport r;
  Status st = diff_runs(a.path(), b.path(), DiffOptions{}, &r);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ExitCode::kBadInput);
  EXPECT_NE(st.message().find(a.path()), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("no trace stream"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("not attached"), std::string::npos) << st.message();
}

TEST(ReportTest, TruncatedIdenticalVerdictSaysWhereItStopped) {
  Scenario s;
  Case c("truncated_text", s);
  std::string bytes = build(s, true).bytes();
  c.b.add_bytes("r0.main.t0", bytes.substr(0, bytes.size() / 2));
  DiffReport r = diff(c);
  ASSERT_EQ(r.verdict, Verdict::kIncomplete);
  std::string text = render_report(r, ReportFormat::kText, false);
  std::string first_line = text.substr(0, text.find('\n'));
  EXPECT_NE(first_line.find("INCOMPLETE"), std::string::npos) << first_line;
  EXPECT_NE(first_line.find("exit 5"), std::string::npos) << first_line;
  EXPECT_NE(text.find("not compared: run B stream r0.main.t0 was cut short"), std::string::npos)
      << text;
}

TEST(ReportTest, EveryFormatCarriesTheKeyFields) {
  Scenario s;
  s.nondet_step = 1;
  Case c("formats", s);
  c.a.env("r0.main", sample_env(2, 1));
  c.b.env("r0.main", sample_env(1, 2));
  DiffReport r = diff(c);

  nlohmann::json j = nlohmann::json::parse(render_report(r, ReportFormat::kJson, false));
  EXPECT_EQ(j["verdict"], "divergent");
  EXPECT_EQ(j["exit_code"], 1);
  const auto& f = j["first_divergence"];
  EXPECT_EQ(f["rank"], 0);
  EXPECT_EQ(f["step"], 1);
  EXPECT_EQ(f["phase"], "backward");
  EXPECT_EQ(f["op"], "aten::_index_put_impl_");
  EXPECT_EQ(f["class"], "nondeterministic-op");
  EXPECT_TRUE(f["index"].is_number());
  EXPECT_EQ(f["catalog"]["id"], "index-put-accumulate-cpu");
  EXPECT_TRUE(f["remedy"].is_string());
  EXPECT_FALSE(j["environment_differences"].empty());
  EXPECT_TRUE(j["truncated"].is_null()) << j["truncated"].dump();

  std::string text = render_report(r, ReportFormat::kText, false);
  EXPECT_NE(text.find("DIVERGENT"), std::string::npos);
  EXPECT_NE(text.find("IndexBackward0 > aten::index_put_ > aten::_index_put_impl_"),
            std::string::npos);
  EXPECT_EQ(text.find("\x1b["), std::string::npos);
  EXPECT_NE(render_report(r, ReportFormat::kText, true).find("\x1b["), std::string::npos);

  std::string junit = render_report(r, ReportFormat::kJunit, false);
  EXPECT_NE(junit.find("<testsuite "), std::string::npos);
  EXPECT_NE(junit.find("<failure"), std::string::npos);
  EXPECT_NE(junit.find("nondeterministic-op"), std::string::npos);

  std::string md = render_report(r, ReportFormat::kMarkdown, false);
  EXPECT_NE(md.find("### First divergence"), std::string::npos);
  EXPECT_NE(md.find("index-put-accumulate-cpu"), std::string::npos);
}

TEST(ReportTest, IdenticalJunitHasNoFailure) {
  Case c("junit_identical", Scenario{});
  DiffReport r = diff(c);
  std::string junit = render_report(r, ReportFormat::kJunit, false);
  EXPECT_EQ(junit.find("<failure"), std::string::npos);
  nlohmann::json j = nlohmann::json::parse(render_report(r, ReportFormat::kJson, false));
  EXPECT_EQ(j["verdict"], "identical");
  EXPECT_TRUE(j["first_divergence"].is_null());
}

TEST(ReportTest, ParseReportFormat) {
  ReportFormat f;
  EXPECT_TRUE(parse_report_format("junit", &f).ok());
  EXPECT_EQ(f, ReportFormat::kJunit);
  EXPECT_EQ(parse_report_format("xml", &f).code(), ExitCode::kUsage);
}

}  // namespace
}  // namespace detaudit

namespace detaudit {
namespace {

// The comparator's fast path may only say "same" when outputs_differ would find no difference.
TEST(OutputDigestsTest, SameOnlyWhenEveryComparedDigestIsEqual) {
  auto make = [](std::initializer_list<int> fills, uint8_t compared) {
    OutputDigests d;
    d.present = true;
    d.count = uint8_t(fills.size());
    d.digest_len = 16;
    d.compared = compared;
    size_t i = 0;
    for (int f : fills) d.digests[i++].fill(uint8_t(f));
    return d;
  };
  EXPECT_TRUE(make({1, 2}, 3).same_as(make({1, 2}, 3)));
  EXPECT_FALSE(make({1, 2}, 3).same_as(make({1, 3}, 3)));     // one digest differs
  EXPECT_FALSE(make({1, 2}, 3).same_as(make({1, 2, 3}, 7)));  // another output count
  EXPECT_FALSE(make({1, 2}, 3).same_as(make({1, 2}, 1)));     // output 1 uninitialized in one run
  EXPECT_TRUE(make({1, 2}, 1).same_as(make({1, 9}, 1)));      // ... in both: not compared
  OutputDigests absent = make({1, 2}, 3);
  absent.present = false;  // beyond the inline outputs or the window: no claim
  EXPECT_FALSE(absent.same_as(absent));
}

// The HTML page escapes what programs name (scopes, ops, paths) and fetches nothing.
TEST(DiffTest, HtmlReportEscapesNamesAndIsSelfContained) {
  Scenario s;
  s.nondet_step = 1;
  Case c("html", s);
  DiffReport r = diff(c);
  ASSERT_TRUE(r.first);
  r.first->scope_path = "<script>alert(1)</script>";
  std::string html = render_report(r, ReportFormat::kHtml, false);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_EQ(html.find("http"), std::string::npos);
  EXPECT_NE(html.find("id=\"growth-plot\""), std::string::npos);
  // One bar per step with divergent ops.
  size_t bars = 0;
  for (size_t at = html.find("class=\"bar\""); at != std::string::npos;
       at = html.find("class=\"bar\"", at + 1))
    ++bars;
  EXPECT_EQ(bars, r.curve.size());
  EXPECT_GT(bars, 0u);
}

// Two unnamed threads claim "thread" and "thread~1" in the order the scheduler starts them: the
// streams pair by what they ran, not by the name each got.
TEST(DiffTest, ClashingThreadNamesPairByWhatTheyRan) {
  RunDir a("clash/run-0"), b("clash/run-1");
  a.add_stream("r0.main.t-thread", build(Scenario{}, false));
  a.add_stream("r0.main.t-thread~1", filled_buffer(0x11, 0x21));
  b.add_stream("r0.main.t-thread", filled_buffer(0x11, 0x21));
  b.add_stream("r0.main.t-thread~1", build(Scenario{}, false));
  DiffOptions o;
  o.catalog = &shipped_catalog();
  DiffReport r;
  ASSERT_TRUE(diff_runs(a.path(), b.path(), o, &r).ok());
  EXPECT_EQ(r.verdict, Verdict::kIdentical);
  EXPECT_EQ(r.structural_count, 0u);
  ASSERT_EQ(r.streams.size(), 2u);
  for (const StreamSummary& s : r.streams) EXPECT_GT(s.compared, 0u) << s.name;

  // A real difference still shows, in the stream that made it.
  RunDir c("clash2/run-0"), d("clash2/run-1");
  Scenario nondet;
  nondet.nondet_step = 1;
  c.add_stream("r0.main.t-thread", build(nondet, false));
  c.add_stream("r0.main.t-thread~1", filled_buffer(0x11, 0x21));
  d.add_stream("r0.main.t-thread", filled_buffer(0x11, 0x21));
  d.add_stream("r0.main.t-thread~1", build(nondet, true));
  ASSERT_TRUE(diff_runs(c.path(), d.path(), o, &r).ok());
  EXPECT_EQ(r.verdict, Verdict::kDivergent);
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kNondeterministicOp);
  EXPECT_EQ(r.first->stream, "r0.main.t-thread");

  // Two child processes started alike claim "python-c" and "python-c~1" the same way.
  RunDir e("clash3/run-0"), f("clash3/run-1");
  e.add_stream("r0.main.python-c.t-main", build(Scenario{}, false));
  e.add_stream("r0.main.python-c~1.t-main", filled_buffer(0x11, 0x21));
  f.add_stream("r0.main.python-c.t-main", filled_buffer(0x11, 0x21));
  f.add_stream("r0.main.python-c~1.t-main", build(Scenario{}, false));
  ASSERT_TRUE(diff_runs(e.path(), f.path(), o, &r).ok());
  EXPECT_EQ(r.verdict, Verdict::kIdentical);
}

// Found by fuzz_trace_reader's author (docs/fuzzing.md): a divergent op whose name is not UTF-8
// made the JSON report throw, exit 3. It is replaced instead, like the timeline's names.
TEST(DiffTest, JsonReportReplacesInvalidUtf8InOpNames) {
  DiffReport r;
  r.verdict = Verdict::kDivergent;
  r.first.emplace();
  r.first->op = std::string("scope\xff\xfe", 7);
  r.first->chain = {r.first->op};
  std::string text;
  ASSERT_NO_THROW(text = render_report(r, ReportFormat::kJson, false));
  nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["first_divergence"]["op"], "scope\xef\xbf\xbd\xef\xbf\xbd");
}

// A scalar return is an output: item() of the same recorded tensor returning another value
// diverges there (the tensor digests agree).
TraceBuilder item_returning(double value) {
  TraceBuilder t;
  t.step(0);
  int64_t x = t.op("aten::ones").out_new(tensor(0x01)).done();
  t.op("aten::_local_scalar_dense").in_ref(x).out_double(value).done();
  t.end();
  return t;
}

TEST(DiffTest, ScalarReturnsAreCompared) {
  RunDir a("item/run-0"), b("item/run-1"), c("item/run-2");
  a.add_stream("r0.main.t-main", item_returning(0.5));
  b.add_stream("r0.main.t-main", item_returning(0.25));
  c.add_stream("r0.main.t-main", item_returning(0.5));
  DiffOptions o;
  DiffReport r;
  ASSERT_TRUE(diff_runs(a.path(), b.path(), o, &r).ok());
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->op, "aten::_local_scalar_dense");
  EXPECT_NE(r.first->evidence.detail.find("scalar return (0.5 vs 0.25)"), std::string::npos)
      << r.first->evidence.detail;
  ASSERT_TRUE(diff_runs(a.path(), c.path(), o, &r).ok());
  EXPECT_EQ(r.verdict, Verdict::kIdentical);
}

// Two all-reduces of one step. `late` puts both COLLECTIVE records after the step's last op,
// the second Work's first, as when gloo completes a later bucket first.
TraceBuilder two_allreduces(uint8_t first_received, bool late) {
  TraceBuilder b;
  b.step(0);
  TensorDesc recv = tensor(1, {8});
  recv.bits |= trace::kTensorNotRead;
  const std::vector<TensorDesc> first = {tensor(first_received, {8})}, second = {tensor(3, {8})};
  b.op("c10d::allreduce_").in_list(1).in_new(recv).out_new(recv).done();
  if (!late) b.collective(0, 1, first);
  b.op("c10d::allreduce_").in_list(1).in_new(recv).out_new(recv).done();
  if (!late) b.collective(1, 2, second);
  b.op("aten::mul").in_new(tensor(4)).in_new(tensor(4)).out_new(tensor(5)).done();
  if (late) {
    b.collective(1, 2, second);
    b.collective(0, 1, first);
  }
  b.end();
  return b;
}

TEST(DiffTest, CollectiveRecordsAttachToTheirOpWhereverTheWorkCompleted) {
  RunDir a("coll/run-0"), b("coll/run-1"), c("coll/run-2");
  a.add_stream("r0.main.t-main", two_allreduces(2, false));
  b.add_stream("r0.main.t-main", two_allreduces(2, true));
  c.add_stream("r0.main.t-main", two_allreduces(9, true));
  DiffOptions o;
  DiffReport r;
  ASSERT_TRUE(diff_runs(a.path(), b.path(), o, &r).ok());
  EXPECT_EQ(r.verdict, Verdict::kIdentical) << (r.first ? r.first->evidence.detail : "");
  ASSERT_TRUE(diff_runs(a.path(), c.path(), o, &r).ok());
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->op, "c10d::allreduce_");
  EXPECT_EQ(r.first->index, 0u);
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kRemoteInput);
}

// Rank 1 races, then all-reduces what it made; rank 0 receives the difference. The race
// happened before rank 0's all-reduce, so it is the first divergence, read by the all-reduce.
TEST(DiffTest, ARaceOnOneRankIsTheOriginOfWhatAnotherReceived) {
  auto ranks = [](RunDir& run, uint8_t raced) {
    TensorDesc recv = tensor(1, {8});
    TraceBuilder r0(0);
    r0.step(0);
    r0.op("aten::mul").in_new(tensor(2, {8})).in_new(tensor(2, {8})).out_new(tensor(3, {8})).done();
    const int64_t sent0 = r0.next_tensor() - 1;
    r0.op("c10d::allreduce_").in_list(1).in_ref(sent0).out_new(recv).done();
    r0.collective(1, 1, {tensor(uint8_t(raced + 100), {8})});
    r0.end();
    TraceBuilder r1(1);
    r1.step(0);
    const int64_t sent1 = r1.op("aten::index_add")
                              .in_new(tensor(2, {8}))
                              .in_new(tensor(4, {8}))
                              .out_new(tensor(raced, {8}))
                              .done();
    r1.op("c10d::allreduce_").in_list(1).in_ref(sent1).out_new(recv).done();
    r1.collective(1, 1, {tensor(uint8_t(raced + 100), {8})});
    r1.end();
    run.add_stream("r0.main.t-main", r0);
    run.add_stream("r1.main.t-main", r1);
  };
  RunDir a("ranks/run-0"), b("ranks/run-1");
  ranks(a, 5);
  ranks(b, 6);
  DiffOptions o;
  DiffReport r;
  ASSERT_TRUE(diff_runs(a.path(), b.path(), o, &r).ok());
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->rank, 1);
  EXPECT_EQ(r.first->op, "aten::index_add");
  EXPECT_EQ(r.first->evidence.confirmed_by, "read by c10d::allreduce_ (op #1, step 0)");
  EXPECT_EQ(r.first->evidence.propagated_through,
            std::vector<std::string>{"c10d::allreduce_ #1 of group 0 to rank 0, step 0"});
}

// Both ranks send the same bytes in both runs, yet each received other bytes in run B: what a
// recorder that hashed the buffers late would show. No op can have caused it, so the diff must
// not call it a divergence of the program: it says why it cannot name a first (exit 6).
TEST(DiffTest, DifferencesNoOpCausedAreUnexplainedNotDivergent) {
  auto ranks = [](RunDir& run, uint8_t received) {
    for (int64_t rank : {0, 1}) {
      TensorDesc recv = tensor(1, {8});
      TraceBuilder b(rank);
      b.step(0);
      const int64_t sent = b.op("aten::mul")
                               .in_new(tensor(2, {8}))
                               .in_new(tensor(2, {8}))
                               .out_new(tensor(3, {8}))
                               .done();
      b.op("c10d::allreduce_").in_list(1).in_ref(sent).out_new(recv).done();
      b.collective(1, 1, {tensor(uint8_t(received + rank), {8})});
      b.end();
      run.add_stream("r" + std::to_string(rank) + ".main.t-main", b);
    }
  };
  RunDir a("unexplained/run-0"), b("unexplained/run-1");
  ranks(a, 5);
  ranks(b, 7);
  DiffOptions o;
  DiffReport r;
  ASSERT_TRUE(diff_runs(a.path(), b.path(), o, &r).ok());
  EXPECT_FALSE(r.first);
  EXPECT_EQ(r.verdict, Verdict::kUnexplained);
  EXPECT_EQ(gate_exit_code(r), ExitCode::kUnexplained);
  EXPECT_NE(
      r.unexplained.find("rank 0 step 0 c10d::allreduce_ (remote-input at c10d::allreduce_ #1"),
      std::string::npos)
      << r.unexplained;
  EXPECT_NE(r.unexplained.find("rank 1 step 0"), std::string::npos) << r.unexplained;
  for (ReportFormat f : {ReportFormat::kText, ReportFormat::kJunit, ReportFormat::kMarkdown})
    EXPECT_NE(render_report(r, f, false).find("could not name the first"), std::string::npos);
  const auto json = nlohmann::json::parse(render_report(r, ReportFormat::kJson, false));
  EXPECT_EQ(json["verdict"], "unexplained");
  EXPECT_EQ(json["exit_code"], 6);
  EXPECT_EQ(json["unexplained"], r.unexplained);
}

// One step: a racing index_add_ writes `scratch` (its digest `raced`), then `then` uses it, then
// the step's result is computed from a fresh input.
TraceBuilder overwrite_case(uint8_t raced,
                            const std::function<void(TraceBuilder&, int64_t)>& then) {
  TraceBuilder b;
  b.step(0);
  const int64_t scratch = b.op("aten::index_add_")
                              .in_new(tensor(1))
                              .in_new(tensor(2, {8}, Provenance::kExternal, Dtype::kInt64))
                              .in_new(tensor(3))
                              .out_new(tensor(raced))
                              .done();
  then(b, scratch);
  b.op("aten::mul").in_new(tensor(6)).in_new(tensor(6)).out_new(tensor(7)).done();
  b.end();
  return b;
}

DiffReport diff_cases(const std::string& name, TraceBuilder a, TraceBuilder b) {
  RunDir ra(name + "/run-0"), rb(name + "/run-1");
  ra.add_stream("r0.main.t-main", a);
  rb.add_stream("r0.main.t-main", b);
  DiffOptions o;
  o.catalog = &shipped_catalog();
  DiffReport r;
  Status s = diff_runs(ra.path(), rb.path(), o, &r);
  EXPECT_TRUE(s.ok()) << s.message();
  return r;
}

TEST(DiffTest, ADifferenceOverwrittenBeforeAnyReadIsNotADivergence) {
  auto zeroed = [](TraceBuilder& b, int64_t scratch) {
    b.op("aten::zero_").in_written(scratch).out_new(tensor(0)).done();
  };
  DiffReport r = diff_cases("unread", overwrite_case(4, zeroed), overwrite_case(5, zeroed));
  EXPECT_EQ(r.verdict, Verdict::kIdentical);
  EXPECT_FALSE(r.first);
  EXPECT_EQ(r.divergent_ops, 0u);
  EXPECT_EQ(gate_exit_code(r), ExitCode::kIdentical);
  EXPECT_EQ(r.unread_differences, 1u);
  ASSERT_TRUE(r.first_unread);
  EXPECT_EQ(r.first_unread->op, "aten::index_add_");
  EXPECT_EQ(r.first_unread->overwritten_by, "aten::zero_ (op #1)");
  EXPECT_NE(render_text(r, false).find("1 difference(s) overwritten before any op read them"),
            std::string::npos);
}

TEST(DiffTest, ADifferenceReadBeforeItIsOverwrittenIsTheFirstDivergence) {
  auto read_then_zeroed = [](TraceBuilder& b, int64_t scratch) {
    b.op("aten::sum").in_ref(scratch).out_new(tensor(8, {})).done();
    b.op("aten::zero_").in_written(scratch).out_new(tensor(0)).done();
  };
  DiffReport r = diff_cases("read", overwrite_case(4, read_then_zeroed),
                            overwrite_case(5, read_then_zeroed));
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->op, "aten::index_add_");
  EXPECT_EQ(r.first->evidence.confirmed_by, "read by aten::sum (op #1, step 0)");
  EXPECT_EQ(r.unread_differences, 0u);
  EXPECT_EQ(gate_exit_code(r), ExitCode::kDivergent);
}

TEST(DiffTest, AReadThroughAViewConfirms) {
  // The view's own bytes differ too (AViewOfAnIdenticalSlot... below is the other case).
  auto viewed = [](uint8_t fill) {
    return [fill](TraceBuilder& b, int64_t scratch) {
      TensorDesc view = tensor(fill, {2, 4}, Provenance::kView);
      b.op("aten::sum").in_new(view, scratch).out_new(tensor(8, {})).done();
      b.op("aten::zero_").in_written(scratch).out_new(tensor(0)).done();
    };
  };
  DiffReport r = diff_cases("view", overwrite_case(4, viewed(9)), overwrite_case(5, viewed(10)));
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->op, "aten::index_add_");
  EXPECT_EQ(r.first->evidence.confirmed_by, "read by aten::sum (op #1, step 0)");
}

TEST(DiffTest, APartialOverwriteOrAResizeLeavesTheDifferenceCounted) {
  auto partly = [](TraceBuilder& b, int64_t scratch) {
    // scratch[0:2].zero_(): a view, not read, first seen: the rest of scratch still differs.
    TensorDesc part = tensor(0, {2, 4}, Provenance::kView);
    part.bits |= trace::kTensorNotRead;
    b.op("aten::zero_").in_new(part, scratch).out_new(tensor(0, {2, 4})).done();
    // resize_ reads nothing and writes nothing: the bytes are kept.
    b.op("aten::resize_").in_ref(scratch).in_none().out_ref(scratch).done();
  };
  DiffReport r = diff_cases("partly", overwrite_case(4, partly), overwrite_case(5, partly));
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->op, "aten::index_add_");
  EXPECT_EQ(r.unread_differences, 0u);
  EXPECT_EQ(gate_exit_code(r), ExitCode::kDivergent);
}

TEST(DiffTest, ADifferenceNeverOverwrittenCountsAtTheStreamsEnd) {
  auto kept = [](TraceBuilder&, int64_t) {};
  DiffReport r = diff_cases("kept", overwrite_case(4, kept), overwrite_case(5, kept));
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->op, "aten::index_add_");
  EXPECT_EQ(r.first->evidence.confirmed_by, "not overwritten before the stream ended");
}

// index_put_ hashes its output again after _index_put_impl_ wrote it: the same bytes under a
// new id, which is the one later ops refer to.
TEST(DiffTest, AnEnclosingOpsNewIdForTheSameBytesIsFollowed) {
  auto nested = [](uint8_t raced) {
    TraceBuilder b;
    b.step(0);
    const uint64_t outer = b.reserve_orders(2);
    b.op("aten::_index_put_impl_", Phase::kForward, 1, int64_t(outer + 1))
        .in_new(tensor(1))
        .in_new(tensor(3))
        .out_new(tensor(raced))
        .done();
    const int64_t scratch = b.op("aten::index_put_", Phase::kForward, 0, int64_t(outer))
                                .in_new(tensor(1))
                                .in_new(tensor(3))
                                .out_new(tensor(raced))
                                .done();
    b.op("aten::copy_").in_written(scratch).in_new(tensor(6)).out_new(tensor(6)).done();
    b.op("aten::mul").in_new(tensor(6)).in_new(tensor(6)).out_new(tensor(7)).done();
    b.end();
    return b;
  };
  DiffReport r = diff_cases("nested", nested(4), nested(5));
  EXPECT_EQ(r.verdict, Verdict::kIdentical) << (r.first ? r.first->evidence.confirmed_by : "");
  EXPECT_EQ(r.unread_differences, 1u);
  ASSERT_TRUE(r.first_unread);
  EXPECT_EQ(r.first_unread->op, "aten::_index_put_impl_");
}

// A later difference that is read is the first divergence when the earlier one was overwritten
// unread, and the earlier one is counted as unread.
TEST(DiffTest, AnEarlierUnreadDifferenceYieldsToALaterReadOne) {
  auto two = [](uint8_t v) {
    return [v](TraceBuilder& b, int64_t scratch) {
      const int64_t other = b.op("aten::index_add_")
                                .in_new(tensor(10))
                                .in_new(tensor(2, {8}, Provenance::kExternal, Dtype::kInt64))
                                .in_new(tensor(3))
                                .out_new(tensor(v))
                                .done();
      b.op("aten::zero_").in_written(scratch).out_new(tensor(0)).done();
      b.op("aten::sum").in_ref(other).out_new(tensor(v, {})).done();
    };
  };
  DiffReport r = diff_cases("two", overwrite_case(4, two(11)), overwrite_case(5, two(12)));
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->index, 1u);
  EXPECT_EQ(r.first->evidence.confirmed_by, "read by aten::sum (op #3, step 0)");
  EXPECT_EQ(r.unread_differences, 1u);
  EXPECT_EQ(r.divergent_ops, 2u);  // the second index_add_ and the sum, not the first
}

// A functional collective returns the buffer its inner c10d op fills: geometry when that op is
// still in flight as the outer one returns, hashed when it already completed. Either way the
// COLLECTIVE record holds the result, and the two runs agree.
TEST(DiffTest, ABufferStillFillingInOneRunIsNotComparedWithItsContentsInTheOther) {
  constexpr uint8_t kInFlight = 0;
  auto run = [](uint8_t returned) {
    TraceBuilder b;
    b.step(0);
    TensorDesc recv = tensor(1, {8});
    recv.bits |= trace::kTensorNotRead;
    const int64_t sent = b.op("aten::clone").in_new(tensor(2, {8})).out_new(tensor(2, {8})).done();
    b.op("c10d::allreduce_").in_list(1).in_ref(sent).out_new(recv).done();
    b.op("_c10d_functional::all_reduce")
        .in_new(tensor(2, {8}))
        .out_new(returned == kInFlight ? recv : tensor(returned, {8}))
        .done();
    b.collective(1, 1, {tensor(9, {8})});
    b.end();
    return b;
  };
  DiffReport r = diff_cases("filling", run(kInFlight), run(9));
  EXPECT_EQ(r.verdict, Verdict::kIdentical) << (r.first ? r.first->evidence.detail : "");
  // Contents on both sides are still compared.
  EXPECT_EQ(diff_cases("filled", run(9), run(7)).verdict, Verdict::kDivergent);
}

// FSDP2's all-gather reads this rank's slot of a buffer whose other slots hold garbage: a view
// whose bytes hashed the same in both runs reads nothing that differs.
TEST(DiffTest, AViewOfAnIdenticalSlotOfADifferingBufferDoesNotConfirm) {
  auto gathered = [](TraceBuilder& b, int64_t scratch) {
    TensorDesc slot = tensor(9, {2, 4}, Provenance::kView);
    b.op("c10d::_allgather_base_")
        .in_written(scratch)
        .in_new(slot, scratch)
        .out_new(tensor(0))
        .done();
  };
  DiffReport r = diff_cases("slot", overwrite_case(4, gathered), overwrite_case(5, gathered));
  EXPECT_EQ(r.verdict, Verdict::kIdentical);
  EXPECT_FALSE(r.first);
  EXPECT_EQ(r.unread_differences, 1u);
  ASSERT_TRUE(r.first_unread);
  EXPECT_EQ(r.first_unread->overwritten_by, "c10d::_allgather_base_ (op #1)");

  // The same read where the slot's bytes differ confirms.
  auto differing_slot = [](uint8_t fill) {
    return [fill](TraceBuilder& b, int64_t scratch) {
      b.op("c10d::_allgather_base_")
          .in_written(scratch)
          .in_new(tensor(fill, {2, 4}, Provenance::kView), scratch)
          .out_new(tensor(0))
          .done();
    };
  };
  r = diff_cases("slot2", overwrite_case(4, differing_slot(9)),
                 overwrite_case(5, differing_slot(10)));
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->op, "aten::index_add_");
  EXPECT_EQ(r.first->evidence.confirmed_by, "read by c10d::_allgather_base_ (op #1, step 0)");
}

// A C++ program's optimizer reads p.grad() as a tensor the recorder could not link to the
// backward's output: the same bytes, in both runs, are still a read.
TEST(DiffTest, AnUnlinkedTensorHoldingTheDifferingBytesInBothRunsIsARead) {
  auto cloned = [](uint8_t raced) {
    return [raced](TraceBuilder& b, int64_t scratch) {
      b.op("aten::clone")
          .in_new(tensor(raced, {4, 4}, Provenance::kExternal))
          .out_new(tensor(raced))
          .done();
      TensorDesc whole = tensor(0, {4, 4}, Provenance::kView);
      whole.bits |= trace::kTensorNotRead;
      b.op("aten::zero_").in_new(whole, scratch).out_new(tensor(0)).done();
    };
  };
  DiffReport r = diff_cases("alias", overwrite_case(4, cloned(4)), overwrite_case(5, cloned(5)));
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->op, "aten::index_add_");
  EXPECT_EQ(r.first->evidence.confirmed_by, "read by aten::clone (op #1, step 0)");
  EXPECT_EQ(r.unread_differences, 0u);
}

// Hogwild: a parameter in shared memory that another process changed since this one last read
// it, and an op whose inputs agreed when it began but which read a shared parameter.
TEST(DiffTest, BytesAnotherProcessWroteThroughSharedMemoryAreSharedMemory) {
  auto hogwild = [](uint8_t weight, trace::Sharing sharing) {
    TraceBuilder b;
    b.step(0);
    TensorDesc w = tensor(weight, {4, 4}, Provenance::kExternal);
    w.sharing = sharing;
    const int64_t out =
        b.op("aten::mm").in_new(tensor(1)).in_new(w).out_new(tensor(weight + 1)).done();
    b.op("aten::sum").in_ref(out).out_new(tensor(9, {})).done();
    b.end();
    return b;
  };
  DiffReport r = diff_cases("shm", hogwild(2, trace::Sharing::kChangedElsewhere),
                            hogwild(3, trace::Sharing::kChangedElsewhere));
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kSharedMemory);
  EXPECT_NE(r.first->evidence.detail.find("changed since this process last read or wrote it"),
            std::string::npos)
      << r.first->evidence.detail;
  EXPECT_NE(r.first->explanation.remedy.find("do not share parameters"), std::string::npos);

  // The same bytes when it began, different outputs: written while the op read them.
  auto during = [](uint8_t out) {
    TraceBuilder b;
    b.step(0);
    TensorDesc w = tensor(2, {4, 4}, Provenance::kExternal);
    w.sharing = trace::Sharing::kSharedMemory;
    const int64_t made = b.op("aten::mm").in_new(tensor(1)).in_new(w).out_new(tensor(out)).done();
    b.op("aten::sum").in_ref(made).out_new(tensor(9, {})).done();
    b.end();
    return b;
  };
  r = diff_cases("shm2", during(5), during(6));
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kSharedMemory);
  // Not in shared memory: the kernel's own nondeterminism, as before.
  auto plain = [](uint8_t out) {
    TraceBuilder b;
    b.step(0);
    const int64_t made = b.op("aten::mm")
                             .in_new(tensor(1))
                             .in_new(tensor(2, {4, 4}, Provenance::kExternal))
                             .out_new(tensor(out))
                             .done();
    b.op("aten::sum").in_ref(made).out_new(tensor(9, {})).done();
    b.end();
    return b;
  };
  r = diff_cases("shm3", plain(5), plain(6));
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kNondeterministicOp);
}

// uniform_ on a DTensor's local shard writes a view of the padded buffer that covers it all.
TEST(DiffTest, AnOverwriteThroughAWholeViewForgetsTheDifference) {
  auto reinitialised = [](TraceBuilder& b, int64_t scratch) {
    TensorDesc whole = tensor(0, {4, 4}, Provenance::kView);
    whole.bits |= trace::kTensorNotRead;
    b.op("aten::uniform_").in_new(whole, scratch).out_new(tensor(0x44)).done();
  };
  DiffReport r = diff_cases("whole", overwrite_case(4, reinitialised),
                            overwrite_case(5, reinitialised));
  EXPECT_EQ(r.verdict, Verdict::kIdentical);
  EXPECT_EQ(r.unread_differences, 1u);
  ASSERT_TRUE(r.first_unread);
  EXPECT_EQ(r.first_unread->overwritten_by, "aten::uniform_ (op #1)");
}

// gloo's runloop threads: the same work, split between two threads as timing allowed.
TEST(DiffTest, LibraryPoolThreadsAreComparedAsOneSetPerProcess) {
  auto work = [](TraceBuilder& t, uint8_t fill) {
    t.op("aten::copy_").in_new(tensor(0x10)).in_new(tensor(fill)).out_new(tensor(fill)).done();
  };
  auto pool_thread = [&](std::vector<uint8_t> fills, uint64_t step = 0) {
    TraceBuilder t;
    t.step(step);
    for (uint8_t f : fills) work(t, f);
    t.end();
    return t;
  };
  RunDir a("pool/run-0"), b("pool/run-1");
  a.add_stream("r0.main.t0", build(Scenario{}, false));
  b.add_stream("r0.main.t0", build(Scenario{}, false));
  a.add_stream("r0.main.t-pt_gloo_runloop", pool_thread({1, 2, 3}));
  a.add_stream("r0.main.t-pt_gloo_runloop~1", pool_thread({4}));
  b.add_stream("r0.main.t-pt_gloo_runloop", pool_thread({2}, 1));  // another step, by timing
  b.add_stream("r0.main.t-pt_gloo_runloop~1", pool_thread({4, 1, 3}));
  DiffOptions o;
  o.catalog = &shipped_catalog();
  DiffReport r;
  ASSERT_TRUE(diff_runs(a.path(), b.path(), o, &r).ok());
  EXPECT_EQ(r.verdict, Verdict::kIdentical);
  EXPECT_EQ(r.structural_count, 0u);
  ASSERT_EQ(r.library_pools.size(), 1u);
  EXPECT_EQ(r.library_pools[0].process, "r0.main");
  EXPECT_EQ(r.library_pools[0].matched, 4u);
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("pt_gloo_runloop (r0.main)"), std::string::npos) << r.notes[0];
  for (ReportFormat f : {ReportFormat::kText, ReportFormat::kMarkdown, ReportFormat::kHtml})
    EXPECT_NE(render_report(r, f, false).find("compared as one set per process"),
              std::string::npos);
  const auto json = nlohmann::json::parse(render_report(r, ReportFormat::kJson, false));
  EXPECT_EQ(json["library_threads"][0]["matched"], 4);
  EXPECT_EQ(json["library_threads"][0]["unmatched_a"], 0);

  // Different data in the pool still counts; with nothing else differing, no first is named.
  RunDir c("pool2/run-0"), d("pool2/run-1");
  c.add_stream("r0.main.t0", build(Scenario{}, false));
  d.add_stream("r0.main.t0", build(Scenario{}, false));
  c.add_stream("r0.main.t-pt_gloo_runloop", pool_thread({1, 2}));
  d.add_stream("r0.main.t-pt_gloo_runloop", pool_thread({1, 9}));
  ASSERT_TRUE(diff_runs(c.path(), d.path(), o, &r).ok());
  EXPECT_EQ(r.verdict, Verdict::kUnexplained);
  EXPECT_EQ(r.divergent_ops, 1u);
  EXPECT_NE(r.unexplained.find("only ops of r0.main's pt_gloo_runloop threads differ"),
            std::string::npos)
      << r.unexplained;
}

// A process that crashed after its last op (a thread aborting at exit) saved every stream with an
// END that names the signal: what both runs recorded is compared in full, and the report says
// which process ended how, after which op. One that crashed earlier than the other run's is a
// cut, not a structural difference.
TEST(DiffTest, ACrashAfterTheLastOpIsComparedInFullAndNamed) {
  auto training = [](int steps, int crash_signal) {
    TraceBuilder t;
    for (int k = 0; k < steps; ++k) {
      t.step(uint64_t(k));
      t.op("aten::mul").in_new(tensor(uint8_t(k))).out_new(tensor(uint8_t(0x40 + k))).done();
    }
    if (crash_signal)
      t.end_by_signal(crash_signal, trace::kEndExiting);
    else
      t.end();
    return t;
  };
  RunDir a("crash/run-0"), b("crash/run-1");
  a.add_stream("r0.main.t-main", training(3, 0));
  b.add_stream("r0.main.t-main", training(3, SIGABRT));
  RunDir::write(b.path() + "/streams/r0.main.status",
                "attached libtorch 2.13.0 pid 9\nended: killed by SIGABRT | after its last "
                "recorded op | while exiting\n");
  RunDir::write(a.path() + "/streams/r0.main.status",
                "attached libtorch 2.13.0 pid 8\nended: exit\n");
  DiffOptions o;
  DiffReport r;
  ASSERT_TRUE(diff_runs(a.path(), b.path(), o, &r).ok());
  EXPECT_EQ(r.verdict, Verdict::kIdentical);
  EXPECT_TRUE(r.not_compared.empty()) << r.not_compared[0];
  EXPECT_EQ(gate_exit_code(r), ExitCode::kIdentical);
  ASSERT_EQ(r.endings.size(), 1u);
  EXPECT_EQ(r.endings[0].run, "B");
  ASSERT_EQ(r.endings[0].processes.size(), 1u);
  const ProcessEndingReport& p = r.endings[0].processes[0];
  EXPECT_EQ(p.ended, "killed by SIGABRT");
  EXPECT_TRUE(p.exiting);
  EXPECT_TRUE(p.streams_whole);
  EXPECT_EQ(p.last_op, "aten::mul");
  EXPECT_EQ(p.last_step, 2u);
  EXPECT_EQ(p.last_index, 2u);
  EXPECT_NE(render_report(r, ReportFormat::kText, false)
                .find("r0.main killed by SIGABRT on a thread that recorded nothing after its last "
                      "recorded op "
                      "(last op: step 2, aten::mul, op #2 of r0.main.t-main), while exiting; its "
                      "streams are whole"),
            std::string::npos)
      << render_report(r, ReportFormat::kText, false);
  const auto json = nlohmann::json::parse(render_report(r, ReportFormat::kJson, false));
  EXPECT_EQ(json["endings"][0]["processes"][0]["ended"], "killed by SIGABRT");
  EXPECT_EQ(json["endings"][0]["processes"][0]["last_op"]["step"], 2);

  // Killed in step 1 of 3: the rest of run A was not compared, and it is a cut, not a structure.
  RunDir c("crash-early/run-0"), d("crash-early/run-1");
  c.add_stream("r0.main.t-main", training(3, 0));
  d.add_stream("r0.main.t-main", training(2, SIGSEGV));
  ASSERT_TRUE(diff_runs(c.path(), d.path(), o, &r).ok());
  EXPECT_EQ(r.verdict, Verdict::kIncomplete);
  EXPECT_EQ(r.structural_count, 0u);
  ASSERT_EQ(r.not_compared.size(), 1u);
  EXPECT_NE(r.not_compared[0].find("the process was killed by SIGSEGV here"), std::string::npos)
      << r.not_compared[0];
}

// A pool thread cut short in one run (its process killed): the other run's pool ops it lacks
// are not compared, never "divergent" (which left the verdict unexplained, exit 6).
TEST(DiffTest, APoolCutShortInOneRunIsNotComparedNotDivergent) {
  auto pool_thread = [](std::vector<uint8_t> fills, bool whole) {
    TraceBuilder t;
    t.step(0);
    for (uint8_t f : fills)
      t.op("aten::copy_").in_new(tensor(0x10)).in_new(tensor(f)).out_new(tensor(f)).done();
    if (whole) t.end();
    return t;
  };
  RunDir a("pool-cut/run-0"), b("pool-cut/run-1");
  a.add_stream("r0.main.t0", build(Scenario{}, false));
  b.add_stream("r0.main.t0", build(Scenario{}, false));
  a.add_stream("r0.main.t-pt_gloo_runloop", pool_thread({1, 2, 3}, true));
  b.add_stream("r0.main.t-pt_gloo_runloop", pool_thread({1}, false));  // the header and one op
  DiffOptions o;
  DiffReport r;
  ASSERT_TRUE(diff_runs(a.path(), b.path(), o, &r).ok());
  EXPECT_EQ(r.verdict, Verdict::kIncomplete);
  EXPECT_EQ(r.divergent_ops, 0u);
  ASSERT_EQ(r.library_pools.size(), 1u);
  EXPECT_EQ(r.library_pools[0].uncompared_a, 2u);
  EXPECT_EQ(r.library_pools[0].unmatched_a, 0u);
  bool said = false;
  for (const std::string& n : r.not_compared)
    said = said || n.find("no END record in run B") != std::string::npos;
  EXPECT_TRUE(said);
}

}  // namespace
}  // namespace detaudit

namespace detaudit {
namespace {

using namespace detaudit::testing;

// Eight data-parallel ranks: each step multiplies, all-reduces what it made and updates the same
// parameter on every rank. In run B, rank `raced` makes other bytes in step 2; with
// `own_update`, its optimizer update also differs there (its replicas disagree).
void data_parallel_ranks(RunDir& run, int64_t raced, bool own_update) {
  constexpr int64_t kRanks = 8;
  for (int64_t rank = 0; rank < kRanks; ++rank) {
    TraceBuilder t(rank);
    int64_t param = t.op("aten::ones").out_new(tensor(0x01, {8})).done();
    uint64_t seq = 0;
    for (uint64_t step = 0; step < 4; ++step) {
      t.step(step);
      const bool here = rank == raced && step == 2;
      const bool after = raced >= 0 && step >= 2;
      const int64_t sent = t.op("aten::index_add", Phase::kBackward)
                               .in_new(tensor(uint8_t(0x10 + rank), {8}))
                               .in_new(tensor(uint8_t(0x30 + step), {8}))
                               .out_new(tensor(uint8_t(0x40 + rank + (here ? 0x80 : 0)), {8}))
                               .done();
      const uint64_t order = t.reserve_orders(1);
      t.op("c10d::allreduce_", Phase::kBackward, 0, int64_t(order))
          .in_list(1)
          .in_ref(sent)
          .out_new(tensor(1, {8}))
          .done();
      t.collective(order, ++seq, {tensor(uint8_t(0x60 + step + (after ? 0x80 : 0)), {8})});
      const int64_t grad = t.next_tensor() - 1;
      param = t.op("aten::add_", Phase::kOptimizer)
                  .in_ref(param)
                  .in_ref(grad)
                  .out_new(tensor(uint8_t(0x70 + step + (here && own_update ? 0x80 : 0)), {8}))
                  .done();
    }
    t.end();
    run.add_stream("r" + std::to_string(rank) + ".main.t-main", t);
  }
}

DiffReport diff_on(const RunDir& a, const RunDir& b, unsigned threads) {
  DiffOptions o;
  o.catalog = &shipped_catalog();
  o.threads = threads;
  DiffReport r;
  Status s = diff_runs(a.path(), b.path(), o, &r);
  EXPECT_TRUE(s.ok()) << s.message();
  return r;
}

TEST(DiffTest, ManyRanksComparedOnManyThreadsGiveTheReportOfOne) {
  RunDir a("many/run-0"), b("many/run-1");
  data_parallel_ranks(a, -1, false);
  data_parallel_ranks(b, 5, false);
  const DiffReport one = diff_on(a, b, 1), four = diff_on(a, b, 4);
  for (const DiffReport* r : {&one, &four}) {
    EXPECT_EQ(r->verdict, Verdict::kDivergent);
    ASSERT_TRUE(r->first);
    EXPECT_EQ(r->first->rank, 5);
    EXPECT_EQ(r->first->op, "aten::index_add");
    EXPECT_EQ(r->first->step, 2u);
    EXPECT_EQ(r->first->evidence.propagated_through.size(), 7u);
  }
  EXPECT_EQ(one.first->evidence.propagated_through, four.first->evidence.propagated_through);
  EXPECT_EQ(one.divergent_ops, four.divergent_ops);
  EXPECT_EQ(one.ops_compared, four.ops_compared);
  ASSERT_EQ(one.streams.size(), four.streams.size());
  for (size_t i = 0; i < one.streams.size(); ++i)
    EXPECT_EQ(one.streams[i].name, four.streams[i].name);
  // The all-reduce carried it, the optimizer read the same sum everywhere: replicas agree.
  for (const DiffReport* r : {&one, &four})
    for (const ReplicaCheck& c : r->replicas) {
      EXPECT_TRUE(c.replicas) << c.not_checked;
      EXPECT_EQ(c.groups.size(), 1u);
      EXPECT_EQ(c.steps_checked, 4u);
      EXPECT_FALSE(c.divergence);
    }
}

TEST(DiffTest, AReplicaThatUpdatesOtherwiseIsFoundByItsStepsFolds) {
  RunDir a("fold/run-0"), b("fold/run-1");
  data_parallel_ranks(a, -1, false);
  data_parallel_ranks(b, 6, true);
  const DiffReport r = diff_on(a, b, 2);
  ASSERT_EQ(r.replicas.size(), 2u);
  EXPECT_FALSE(r.replicas[0].divergence);
  ASSERT_TRUE(r.replicas[1].divergence);
  const ReplicaDivergence& d = *r.replicas[1].divergence;
  EXPECT_EQ(d.rank, 6);
  EXPECT_EQ(d.reference_rank, 0);
  EXPECT_EQ(d.step, 2u);
  EXPECT_EQ(d.position, 0u);
  EXPECT_EQ(d.op, "aten::add_");
  EXPECT_EQ(d.input_differs, "");  // same parameter and gradient in
  EXPECT_EQ(d.parted_at, "");      // both ran the same ops
}

}  // namespace
}  // namespace detaudit

namespace detaudit {
namespace {

using namespace detaudit::testing;

// A diff split by ranks and merged gives the whole diff's verdict, first divergence, spread and
// replica check.
TEST(PartialDiffTest, MergedPartsGiveTheWholeDiffsVerdict) {
  RunDir a("parts/run-0"), b("parts/run-1");
  data_parallel_ranks(a, -1, false);
  data_parallel_ranks(b, 6, true);
  const DiffReport whole = diff_on(a, b, 2);
  std::vector<nlohmann::json> parts(2);
  for (int k = 0; k < 2; ++k) {
    DiffOptions o;
    o.catalog = &shipped_catalog();
    ASSERT_TRUE(
        RangeSet::parse(nlohmann::json::array({k == 0 ? "0-3" : "4-"}), "ranks", &o.ranks).ok());
    ASSERT_TRUE(diff_part(a.path(), b.path(), o, &parts[k]).ok());
    EXPECT_EQ(parts[k]["streams"].size(), 4u);
  }
  DiffOptions o;
  o.catalog = &shipped_catalog();
  DiffReport merged;
  Status s = merge_parts(parts, {"p0", "p1"}, o, &merged);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(merged.verdict, whole.verdict);
  ASSERT_TRUE(merged.first && whole.first);
  EXPECT_EQ(merged.first->stream, whole.first->stream);
  EXPECT_EQ(merged.first->index, whole.first->index);
  EXPECT_EQ(merged.first->divergence_class, whole.first->divergence_class);
  EXPECT_EQ(merged.first->evidence.propagated_through, whole.first->evidence.propagated_through);
  EXPECT_EQ(merged.first->explanation.cause, whole.first->explanation.cause);
  EXPECT_EQ(merged.first->explanation.remedy, whole.first->explanation.remedy);
  EXPECT_EQ(merged.divergent_ops, whole.divergent_ops);
  EXPECT_EQ(merged.ops_compared, whole.ops_compared);
  ASSERT_EQ(merged.replicas.size(), 2u);
  ASSERT_TRUE(merged.replicas[1].divergence && whole.replicas[1].divergence);
  EXPECT_EQ(merged.replicas[1].divergence->detail, whole.replicas[1].divergence->detail);
  EXPECT_EQ(merged.replicas[1].steps_checked, whole.replicas[1].steps_checked);
  EXPECT_EQ(gate_exit_code(merged), gate_exit_code(whole));

  // A part given twice overlaps itself: refused.
  EXPECT_FALSE(merge_parts({parts[0], parts[0]}, {"p0", "p0 again"}, o, &merged).ok());
  nlohmann::json other = parts[1];
  other["run_a"] = "/elsewhere/run-0";
  Status mixed = merge_parts({parts[0], other}, {"p0", "p1"}, o, &merged);
  EXPECT_FALSE(mixed.ok());
  EXPECT_NE(mixed.message().find("merge the parts of one pair"), std::string::npos);
}

}  // namespace
}  // namespace detaudit
