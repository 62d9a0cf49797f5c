// Runs that are not meant to match bit for bit (issue 61): two torch builds' fingerprints, the
// tolerance tiers and where the numerics first leave them.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "catalog/catalog.h"
#include "diff/diff.h"
#include "diff/environment.h"
#include "diff/report_model.h"
#include "report/render.h"
#include "test_files.h"
#include "trace_builder.h"

namespace detaudit {
namespace {

using namespace detaudit::testing;

const char* kBuild213 =
    "PyTorch built with:\n"
    "  - GCC 13.3\n"
    "  - Intel(R) MKL-DNN v3.12.0 (Git Hash 80afa71)\n"
    "  - NNPACK is enabled\n"
    "  - CPU capability usage: AVX2\n"
    "  - Build settings: BLAS_INFO=mkl, COMMIT_SHA=cf30153, CXX_FLAGS= -O2 -DUSE_FBGEMM -fPIC, "
    "CUDA_FLAGS= -Xfatbin -compress-all,--x,--y, TORCH_VERSION=2.13.0, USE_CUDA=0, \n";
const char* kBuild113 =
    "PyTorch built with:\n"
    "  - GCC 12.2\n"
    "  - Intel(R) MKL-DNN v2.6.3 (Git Hash N/A)\n"
    "  - CPU capability usage: AVX2\n"
    "  - Build settings: BLAS_INFO=generic, CXX_FLAGS=-g -O2 -fPIC -DUSE_XNNPACK, "
    "TORCH_VERSION=1.13.0, USE_CUDA=OFF, \n";

nlohmann::json build_env(const std::string& version, const char* build_config, bool bf16_flag) {
  nlohmann::json j = sample_env(1, 7);
  j["torch_version"] = version;
  j["build_config"] = build_config;
  if (bf16_flag) j["determinism"]["allow_bf16_reduction_cublas"] = {{"split_k", true}};
  return j;
}

const EnvDifference* find_key(const std::vector<EnvDifference>& env, const std::string& key) {
  for (const EnvDifference& d : env)
    if (d.key == key) return &d;
  return nullptr;
}

// Run A's stream against run B's, in run directories named after `name`.
DiffReport diff_streams(const std::string& name, const TraceBuilder& a, const TraceBuilder& b,
                        const DiffOptions& options = DiffOptions{}) {
  RunDir ra(name + "/run-0"), rb(name + "/run-1");
  ra.add_stream("r0.main.t0", a);
  rb.add_stream("r0.main.t0", b);
  DiffReport r;
  EXPECT_TRUE(diff_runs(ra.path(), rb.path(), options, &r).ok());
  return r;
}

TEST(NumericsTest, TwoTorchBuildsDifferByTheLinesThatDoTheVersionFirst) {
  std::map<std::string, std::string> a, b;
  split_build_config(kBuild213, &a);
  split_build_config(kBuild113, &b);
  EXPECT_EQ(a.at("build_config.GCC"), "13.3");
  EXPECT_EQ(a.at("build_config.Intel(R) MKL-DNN"), "v3.12.0 (Git Hash 80afa71)");
  EXPECT_EQ(a.at("build_config.NNPACK is enabled"), "yes");
  EXPECT_EQ(a.at("build_config.CPU capability usage"), "AVX2");
  EXPECT_EQ(a.at("build_config.BLAS_INFO"), "mkl");
  // A comma inside a setting's value does not start another setting.
  EXPECT_EQ(a.at("build_config.CUDA_FLAGS"), "-Xfatbin -compress-all,--x,--y");
  EXPECT_EQ(a.at("build_config.USE_CUDA"), "0");

  a["torch_version"] = "2.13.0";
  b["torch_version"] = "1.13.0";
  a["intra_op_threads"] = b["intra_op_threads"] = "1";
  a["command_line"] = "[\"python\",\"a.py\"]";
  b["command_line"] = "[\"python3\",\"a.py\"]";
  const auto env = diff_environment({{"r0.main", a}}, "", {{"r0.main", b}}, "");
  ASSERT_GE(env.size(), 6u);
  EXPECT_EQ(env[0].key, "torch_version");
  EXPECT_EQ(env.back().key.rfind("build_config.", 0) == 0 || env.back().key == "command_line", true)
      << env.back().key;
  // The library that computes comes before the compiler that built it.
  size_t blas = 0, gcc = 0;
  for (size_t i = 0; i < env.size(); ++i) {
    if (env[i].key == "build_config.BLAS_INFO") blas = i;
    if (env[i].key == "build_config.GCC") gcc = i;
  }
  EXPECT_LT(blas, gcc);
  EXPECT_EQ(find_key(env, "build_config"), nullptr) << "the whole text is not a difference";
  EXPECT_EQ(find_key(env, "build_config.TORCH_VERSION"), nullptr) << "torch_version says it";
  EXPECT_EQ(find_key(env, "build_config.CPU capability usage"), nullptr) << "the same in both";
  const EnvDifference* flags = find_key(env, "build_config.CXX_FLAGS (flags only in each)");
  ASSERT_NE(flags, nullptr);
  EXPECT_EQ(flags->a, "-DUSE_FBGEMM");
  EXPECT_EQ(flags->b, "-g -DUSE_XNNPACK");
  const EnvDifference* cuda_flags = find_key(env, "build_config.CUDA_FLAGS (flags only in each)");
  ASSERT_NE(cuda_flags, nullptr);
  EXPECT_EQ(cuda_flags->a, "2 flags");
  EXPECT_EQ(cuda_flags->b, "(absent)");
}

// aten::mm reads the same tensors in both runs and writes other bits; relu reads them.
TraceBuilder gemm_then_relu(uint8_t out) {
  TraceBuilder t;
  t.step(0);
  int64_t y =
      t.op("aten::mm").in_new(tensor(0x10)).in_new(tensor(0x11)).out_new(tensor(out)).done();
  t.op("aten::relu").in_ref(y).out_new(tensor(uint8_t(out + 1))).done();
  t.end();
  return t;
}

TEST(NumericsTest, AnotherTorchBuildIsNamedWithTheLibraryThatComputesTheOp) {
  RunDir a("numerics_build/run-0"), b("numerics_build/run-1");
  a.add_stream("r0.main.t0", gemm_then_relu(0x20));
  b.add_stream("r0.main.t0", gemm_then_relu(0x40));
  // A determinism flag one torch has and the other lacks is no setting that differs.
  a.env("r0.main", build_env("2.13.0", kBuild213, true));
  b.env("r0.main", build_env("1.13.0", kBuild113, false));
  DiffOptions o;
  o.catalog = &shipped_catalog();
  DiffReport r;
  ASSERT_TRUE(diff_runs(a.path(), b.path(), o, &r).ok());
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->op, "aten::mm");
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kTorchBuild) << r.first->evidence.detail;
  EXPECT_NE(r.first->explanation.cause.find("torch 2.13.0 in run A, 1.13.0 in run B"),
            std::string::npos)
      << r.first->explanation.cause;
  EXPECT_NE(r.first->explanation.cause.find(
                "the BLAS library (a CPU GEMM), mkl in run A and generic in run B"),
            std::string::npos)
      << r.first->explanation.cause;
  EXPECT_EQ(r.first->explanation.cause.find("allow_bf16"), std::string::npos)
      << r.first->explanation.cause;
  EXPECT_NE(render_report(r, ReportFormat::kJson, false).find("\"torch-build\""),
            std::string::npos);

  // The same build: the class stays a nondeterministic op's.
  b.env("r0.main", build_env("2.13.0", kBuild213, true));
  DiffReport same;
  ASSERT_TRUE(diff_runs(a.path(), b.path(), o, &same).ok());
  ASSERT_TRUE(same.first);
  EXPECT_EQ(same.first->divergence_class, DivergenceClass::kNondeterministicOp);
}

// A float32 tensor of 100 elements with the given statistics; `fill` sets its digest.
TensorDesc with_stats(uint8_t fill, double min, double max, double mean, double l2) {
  TensorDesc t = tensor(fill, {100});
  t.stats.min = min;
  t.stats.max = max;
  t.stats.mean = mean;
  t.stats.l2 = l2;
  return t;
}

TraceBuilder one_output(const TensorDesc& out) {
  TraceBuilder t;
  t.step(0);
  int64_t y = t.op("aten::sum").in_new(tensor(0x10, {100})).out_new(out).done();
  t.op("aten::relu").in_ref(y).out_new(tensor(0x31)).done();
  t.end();
  return t;
}

bool gate_passes(const std::string& name, const TensorDesc& ta, const TensorDesc& tb,
                 GateConfig gate) {
  RunDir a(name + "/run-0"), b(name + "/run-1");
  a.add_stream("r0.main.t0", one_output(ta));
  b.add_stream("r0.main.t0", one_output(tb));
  DiffOptions o;
  o.gate = gate;
  DiffReport r;
  EXPECT_TRUE(diff_runs(a.path(), b.path(), o, &r).ok());
  EXPECT_EQ(r.verdict, Verdict::kDivergent);
  return gate_exit_code(r) == ExitCode::kIdentical;
}

TEST(NumericsTest, AMeanNearZeroIsMeasuredAgainstTheTensorsRootMeanSquare) {
  // A gradient: values of magnitude 1 (L2 10 over 100 elements) whose mean is nearly 0. Its
  // mean moving from 1e-10 to 3e-10 is 2e-10 of its scale, not 200% of itself.
  TensorDesc ta = with_stats(0x21, -1, 1, 1e-10, 10), tb = with_stats(0x22, -1, 1, 3e-10, 10);
  EXPECT_TRUE(gate_passes("numerics_mean", ta, tb, GateConfig{"tolerance", 1e-6, 0}));
  EXPECT_FALSE(gate_passes("numerics_mean_tight", ta, tb, GateConfig{"tolerance", 1e-12, 0}));
}

TEST(NumericsTest, UlpIsTheDtypesEpsilonAtEachStatisticsScale) {
  const double eps = std::ldexp(1.0, -23);  // float32
  GateConfig ulp16{"tolerance", 0, 0};
  ulp16.ulp = 16;
  // L2 10: 16 ulp is 10 * 16 * eps.
  TensorDesc ta = with_stats(0x21, -1, 1, 0.1, 10);
  TensorDesc inside = with_stats(0x22, -1, 1, 0.1, 10 + 10 * 8 * eps);
  TensorDesc outside = with_stats(0x23, -1, 1, 0.1, 10 + 10 * 32 * eps);
  EXPECT_TRUE(gate_passes("numerics_ulp_in", ta, inside, ulp16));
  EXPECT_FALSE(gate_passes("numerics_ulp_out", ta, outside, ulp16));
  // bfloat16's epsilon is 2^-7: the same gate lets its tensors move 2^16 times as far.
  TensorDesc ba = ta, bb = with_stats(0x24, -1, 1, 0.1, 10 + 10 * 4 * std::ldexp(1.0, -7));
  ba.dtype = bb.dtype = Dtype::kBFloat16;
  EXPECT_TRUE(gate_passes("numerics_ulp_bf16", ba, bb, ulp16));
}

// Three ops in a chain at step 1: scale (within tolerance), gelu (beyond, its input within),
// then a matmul whose input is already beyond. Step 0 agrees.
TraceBuilder chain(bool b) {
  const double eps = std::ldexp(1.0, -23);
  TraceBuilder t;
  for (uint64_t step = 0; step < 2; ++step) {
    t.step(step);
    const bool moved = b && step == 1;
    int64_t x = t.op("aten::mul")
                    .in_new(tensor(0x10, {100}))
                    .in_double(2)
                    .out_new(moved ? with_stats(0x12, -1, 1, 0.1, 10 + 10 * 2 * eps)
                                   : with_stats(0x11, -1, 1, 0.1, 10))
                    .done();
    int64_t h = t.op("aten::gelu")
                    .in_ref(x)
                    .out_new(moved ? with_stats(0x22, -1, 1, 0.1, 10 * (1 + 1e-3))
                                   : with_stats(0x21, -1, 1, 0.1, 10))
                    .done();
    t.op("aten::mm")
        .in_ref(h)
        .in_new(tensor(0x30, {100}))
        .out_new(moved ? with_stats(0x32, -1, 1, 0.1, 10 * (1 + 1e-2))
                       : with_stats(0x31, -1, 1, 0.1, 10))
        .done();
  }
  t.end();
  return t;
}

TEST(NumericsTest, TheFirstOpBeyondTheToleranceWithItsInputsWithinIsNamed) {
  RunDir a("numerics_chain/run-0"), b("numerics_chain/run-1");
  a.add_stream("r0.main.t0", chain(false));
  b.add_stream("r0.main.t0", chain(true));
  DiffOptions o;
  o.gate = GateConfig{"tolerance", 0, 0};
  o.gate.ulp = 16;
  DiffReport r;
  ASSERT_TRUE(diff_runs(a.path(), b.path(), o, &r).ok());
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->op, "aten::mul") << "the first bit difference is the scale's";
  ASSERT_TRUE(r.numerics_change);
  const NumericsChange& n = *r.numerics_change;
  EXPECT_EQ(n.op, "aten::gelu");
  EXPECT_EQ(n.step, 1u);
  EXPECT_EQ(n.tensor, "output 0");
  EXPECT_NEAR(n.output_relative, 1e-3, 1e-9);
  EXPECT_EQ(n.input, "input 0");
  EXPECT_NEAR(n.input_ulps, 2, 1e-6);
  EXPECT_EQ(gate_exit_code(r), ExitCode::kDivergent);
  const std::string text = render_report(r, ReportFormat::kText, false);
  EXPECT_NE(text.find("first beyond tolerance: rank 0 step 1, forward phase, aten::gelu"),
            std::string::npos)
      << text;
  const auto json = nlohmann::json::parse(render_report(r, ReportFormat::kJson, false));
  EXPECT_EQ(json["numerics_change"]["op"], "aten::gelu");
  EXPECT_EQ(json["numerics_change"]["step"], 1);
  // Then through the step: the gelu's move, then the matmul after it, ten times further.
  ASSERT_EQ(n.growth.size(), 2u);
  EXPECT_EQ(n.growth[0].op, "aten::gelu");
  EXPECT_EQ(n.growth[1].op, "aten::mm");
  EXPECT_NEAR(n.growth[1].relative, 1e-2, 1e-8);
  EXPECT_EQ(json["numerics_change"]["growth"].size(), 2u);
  EXPECT_NE(text.find("then through step 1 (2 divergent op(s)"), std::string::npos) << text;
  EXPECT_NE(render_report(r, ReportFormat::kHtml, false).find("id=\"layer-growth-plot\""),
            std::string::npos);

  // Looser than the gelu's move: nothing leaves the tolerance, and the gate passes.
  o.gate.ulp = 0;
  o.gate.rtol = 0.1;
  DiffReport loose;
  ASSERT_TRUE(diff_runs(a.path(), b.path(), o, &loose).ok());
  EXPECT_FALSE(loose.numerics_change);
  EXPECT_EQ(gate_exit_code(loose), ExitCode::kIdentical);
}

// One layer written two ways (issue 61's refactor): run A's nn.Linear (linear > addmm), run B's
// `x @ W.t() + b` (mm, then add); the gelu after reads what each hands on. `result` is run B's
// value (run A's is with_stats(0x21, ...) with 0x21's digest).
TraceBuilder refactored(bool matmul, const TensorDesc& result) {
  TraceBuilder t;
  for (uint64_t step = 0; step < 2; ++step) {
    t.step(step);
    int64_t x = t.op("aten::randn").out_new(tensor(0x10, {100})).done();
    int64_t y;
    if (!matmul) {
      y = t.op("aten::addmm", Phase::kForward, 1)
              .in_ref(x)
              .out_new(with_stats(0x21, -1, 1, 0.1, 10))
              .done();
      t.op("aten::linear").in_ref(x).out_ref(y).done();
    } else {
      int64_t m = t.op("aten::mm").in_ref(x).out_new(tensor(0x40, {100})).done();
      y = t.op("aten::add").in_ref(m).out_new(result).done();
    }
    int64_t h = t.op("aten::gelu").in_ref(y).out_new(tensor(0x50, {100})).done();
    for (const char* op : {"aten::relu", "aten::neg", "aten::abs", "aten::exp"})
      h = t.op(op).in_ref(h).out_new(tensor(0x60, {100})).done();
  }
  t.end();
  return t;
}

DiffReport diff_refactor(const std::string& name, const TensorDesc& result, GateConfig gate) {
  DiffOptions o;
  o.gate = gate;
  return diff_streams(name, refactored(false, result), refactored(true, result), o);
}

TEST(NumericsTest, OtherOpsForTheSameValuesAreMatchedByWhatTheyHandOn) {
  const TensorDesc same = with_stats(0x21, -1, 1, 0.1, 10);
  DiffReport strict = diff_refactor("refactor_same", same, GateConfig{});
  ASSERT_TRUE(strict.first);
  EXPECT_EQ(strict.first->divergence_class, DivergenceClass::kStructural);
  EXPECT_TRUE(strict.first->evidence.same_values);
  EXPECT_NE(strict.first->explanation.cause.find("other ops for the same values"),
            std::string::npos)
      << strict.first->explanation.cause;
  ASSERT_EQ(strict.structural.size(), 2u);
  ASSERT_TRUE(strict.structural[0].values);
  EXPECT_EQ(strict.structural[0].values->handed_on, 2u) << "linear's in A, add's in B";
  EXPECT_EQ(strict.structural[0].values->exact, 2u);
  EXPECT_EQ(strict.structure_matched, 2u);
  EXPECT_EQ(strict.structure_same_bits, 2u);
  // Every value handed on and every op after the same bits: a refactor that computes what the
  // other run did passes the default gate, its regions listed, and the headline says so.
  EXPECT_EQ(strict.verdict, Verdict::kSameValues);
  EXPECT_EQ(gate_exit_code(strict), ExitCode::kIdentical);
  EXPECT_EQ(gate_word(strict), "identical values (other ops)");
  DiffReport tolerant = diff_refactor("refactor_same_t", same, GateConfig{"tolerance", 0, 0});
  EXPECT_TRUE(tolerant.structure_tolerated);
  EXPECT_FALSE(tolerant.numerics_change);
  EXPECT_EQ(gate_exit_code(tolerant), ExitCode::kIdentical);
}

TEST(NumericsTest, OtherOpsWhoseValuesMovedFailTheDefaultGate) {
  // Run B's add one bit off run A's addmm: the region hands on other bits, and so does
  // everything after it.
  const TensorDesc moved = with_stats(0x22, -1, 1, 0.1, 10 + 10 * std::ldexp(1.0, -23));
  DiffReport strict = diff_refactor("refactor_moved", moved, GateConfig{});
  EXPECT_EQ(strict.verdict, Verdict::kDivergent);
  EXPECT_EQ(strict.structure_same_bits, 0u);
  EXPECT_EQ(gate_exit_code(strict), ExitCode::kDivergent);
  EXPECT_EQ(gate_word(strict), "divergent");
}

// The headline never contradicts the exit code: a passing word exactly where the gate exits 0.
TEST(NumericsTest, TheHeadlineIsTheGatesWord) {
  const std::set<std::string> passing = {"identical", "identical values (other ops)",
                                         "training identical", "within tolerance"};
  const TensorDesc same = with_stats(0x21, -1, 1, 0.1, 10);
  const TensorDesc moved = with_stats(0x22, -1, 1, 0.1, 10 + 10 * 4 * std::ldexp(1.0, -23));
  GateConfig within{"tolerance", 0, 0}, beyond{"tolerance", 0, 0};
  within.ulp = 16;
  beyond.ulp = 1;
  const std::vector<std::pair<std::string, DiffReport>> reports = {
      {"identical values", diff_refactor("headline_same", same, GateConfig{})},
      {"divergent", diff_refactor("headline_moved", moved, GateConfig{})},
      {"within tolerance", diff_refactor("headline_within", moved, within)},
      {"beyond tolerance", diff_refactor("headline_beyond", moved, beyond)}};
  for (const auto& [expected, r] : reports) {
    const std::string word = gate_word(r);
    EXPECT_EQ(word.rfind(expected, 0), 0u) << word;
    EXPECT_EQ(passing.count(word) == 1, gate_exit_code(r) == ExitCode::kIdentical) << word;
  }
}

TEST(NumericsTest, AReplacedRegionWhoseValuesMovedIsWhereNumericsChanged) {
  const double eps = std::ldexp(1.0, -23);
  // Run B's add: 4 ulp off run A's addmm (other bits, so other downstream digests too).
  const TensorDesc moved = with_stats(0x22, -1, 1, 0.1, 10 + 10 * 4 * eps);
  GateConfig gate{"tolerance", 0, 0};
  gate.ulp = 16;
  DiffReport within = diff_refactor("refactor_within", moved, gate);
  ASSERT_TRUE(within.structural.size() && within.structural[0].values);
  EXPECT_EQ(within.structural[0].values->within, 2u);
  EXPECT_FALSE(within.first->evidence.same_values);
  EXPECT_EQ(gate_exit_code(within), ExitCode::kIdentical);

  gate.ulp = 1;
  DiffReport beyond = diff_refactor("refactor_beyond", moved, gate);
  ASSERT_TRUE(beyond.numerics_change);
  EXPECT_EQ(beyond.numerics_change->op, "aten::linear") << "the outermost op that returned it";
  EXPECT_EQ(beyond.numerics_change->replaced_by, "aten::add");
  EXPECT_EQ(beyond.numerics_change->step, 0u);
  EXPECT_NEAR(beyond.numerics_change->output_ulps, 4, 1e-6);
  EXPECT_EQ(gate_exit_code(beyond), ExitCode::kDivergent);
  const std::string text = render_report(beyond, ReportFormat::kText, false);
  EXPECT_NE(text.find("aten::linear, replaced by aten::add in run B"), std::string::npos) << text;
  // The headline says where the gate failed, once: the gate's word, then the place.
  EXPECT_EQ(text.rfind("BEYOND TOLERANCE at rank 0 step 0 forward aten::linear (aten::add in run "
                       "B): value handed on moved",
                       0),
            0u)
      << text;
}

// A refactor's backward in autograd's order (issue 82): nn.Linear's AddmmBackward0 makes both
// gradients before the bias's sum and its bucket copy (run A); `x @ W.t() + b`'s AddBackward0
// hands the bias's on first, its MmBackward0 after (run B). Two stretches of other ops with the
// ops both ran between them, one region. `planted_at`: from that step on, run B's exp differs.
TraceBuilder backward_in_order(bool matmul, int64_t planted_at = -1) {
  TraceBuilder t;
  const Phase bw = Phase::kBackward;
  for (uint64_t step = 0; step < 3; ++step) {
    t.step(step);
    int64_t x = t.op("aten::randn", bw).out_new(tensor(0x10, {16})).done();
    int64_t g1 = -1, g2 = -1;
    auto gradients = [&] {
      g1 = t.op("aten::mm", bw, 1).in_ref(x).out_new(tensor(0x31, {8})).done();
      g2 = t.op("aten::mm", bw, 1).in_ref(x).out_new(tensor(0x32, {4})).done();
    };
    if (!matmul) {
      gradients();
      t.op("AddmmBackward0", bw).done();
    } else {
      t.op("AddBackward0", bw).done();
    }
    // The bias's gradient, [1, 2], read as [2] by the bucket copy.
    t.op("aten::sum", bw).in_ref(x).out_new(tensor(0x33, {1, 2})).done();
    int64_t h =
        t.op("aten::mul", bw, 1).in_new(tensor(0x33, {2})).out_new(tensor(0x34, {2})).done();
    for (const char* op : {"aten::neg", "aten::abs", "aten::relu", "aten::sigmoid"})
      h = t.op(op, bw).in_ref(h).out_new(tensor(0x35, {2})).done();
    if (matmul) {
      gradients();
      t.op("MmBackward0", bw).done();
    }
    const bool planted = matmul && planted_at >= 0 && int64_t(step) >= planted_at;
    t.op("aten::gelu", bw).in_ref(g1).out_new(tensor(0x50, {8})).done();
    t.op("aten::exp", bw).in_ref(g2).out_new(tensor(planted ? 0x61 : 0x60, {4})).done();
    for (const char* op : {"aten::neg", "aten::abs", "aten::relu", "aten::sigmoid"})
      t.op(op, bw).in_ref(h).out_new(tensor(0x70, {2})).done();
  }
  t.end();
  return t;
}

DiffReport diff_backward(const std::string& name, int64_t planted_at) {
  return diff_streams(name, backward_in_order(false), backward_in_order(true, planted_at));
}

TEST(NumericsTest, ABackwardRefactorInAutogradsOtherOrderIsOneRegionOfTheSameBits) {
  DiffReport r = diff_backward("backward_order", -1);
  ASSERT_EQ(r.structural.size(), 3u) << "one region a step";
  for (const StructuralDifference& d : r.structural) {
    ASSERT_TRUE(d.values) << d.detail;
    EXPECT_TRUE(d.values->same_bits()) << d.detail;
    EXPECT_EQ(d.values->unmatched, 0u) << d.detail;
    EXPECT_NE(d.detail.find("2 stretches of other ops"), std::string::npos) << d.detail;
  }
  EXPECT_EQ(r.verdict, Verdict::kSameValues);
  EXPECT_EQ(gate_exit_code(r), ExitCode::kIdentical);
}

TEST(NumericsTest, AValueChangedAfterARefactorIsTheFirstDivergenceAtItsStep) {
  DiffReport r = diff_backward("backward_planted", 1);
  ASSERT_TRUE(r.first);
  EXPECT_EQ(std::make_pair(r.first->op, r.first->step),
            std::make_pair(std::string("aten::exp"), uint64_t(1)));
  EXPECT_NE(r.first->divergence_class, DivergenceClass::kStructural);
  EXPECT_EQ(gate_exit_code(r), ExitCode::kDivergent);
}

// A forward refactor's region and the backward that reads it (issue 82): the forward hands on
// the same bits to the op after it. Run A's region also keeps a value for its gradient (LayerNorm's
// rstd) that run B's, another algorithm, keeps otherwise; `compiled`: run B's region clones
// the generator's state from outside, as torch.compile does, a value no eager op makes. The
// backward then hands on the same gradients.
TraceBuilder forward_region(bool by_hand, bool compiled = false) {
  TraceBuilder t;
  const Phase bw = Phase::kBackward;
  for (uint64_t step = 0; step < 2; ++step) {
    t.step(step);
    int64_t x = t.op("aten::randn").out_new(tensor(0x10, {64})).done();
    int64_t y, saved;
    if (!by_hand) {
      saved = t.op("aten::native_layer_norm", Phase::kForward, 1)
                  .in_ref(x)
                  .out_new(tensor(0x21, {8}))
                  .done();
      y = t.op("aten::layer_norm").in_ref(x).out_new(tensor(0x22, {64})).done();
    } else {
      int64_t m = t.op("aten::mean").in_ref(x).out_new(tensor(0x30, {8})).done();
      saved = t.op("aten::sqrt").in_ref(m).out_new(tensor(0x31, {8})).done();
      if (compiled)
        t.op("aten::clone")
            .in_new(tensor(0x32, {5056}, Provenance::kExternal, Dtype::kUInt8))
            .out_new(tensor(0x32, {5056}, Provenance::kOutput, Dtype::kUInt8))
            .done();
      y = t.op("aten::div").in_ref(x).in_ref(saved).out_new(tensor(0x22, {64})).done();
    }
    int64_t h = t.op("aten::gelu").in_ref(y).out_new(tensor(0x50, {64})).done();
    for (const char* op : {"aten::relu", "aten::neg", "aten::abs", "aten::exp"})
      h = t.op(op).in_ref(h).out_new(tensor(0x60, {64})).done();
    // The backward: each run's own gradient op reads its saved value.
    int64_t g = t.op(by_hand ? "DivBackward0" : "NativeLayerNormBackward0", bw)
                    .in_ref(h)
                    .in_ref(saved)
                    .out_new(tensor(0x70, {64}))
                    .done();
    for (const char* op : {"aten::neg", "aten::abs", "aten::relu", "aten::sigmoid"})
      g = t.op(op, bw).in_ref(g).out_new(tensor(0x71, {64})).done();
  }
  t.end();
  return t;
}

TEST(NumericsTest, AValueSavedForTheGradientIsTheRegionsStateNotAValueItHandsOn) {
  for (bool compiled : {false, true}) {
    DiffReport r = diff_streams(compiled ? "saved_compiled" : "saved", forward_region(false),
                                forward_region(true, compiled));
    ASSERT_FALSE(r.structural.empty());
    for (const StructuralDifference& d : r.structural) {
      ASSERT_TRUE(d.values) << d.detail;
      EXPECT_TRUE(d.values->same_bits()) << d.detail;
      EXPECT_EQ(d.values->unmatched, 0u) << d.detail;
    }
    EXPECT_EQ(r.verdict, Verdict::kSameValues) << compiled;
    EXPECT_EQ(gate_exit_code(r), ExitCode::kIdentical);
  }
}

// A refactor's gradient contributions summed in another order (issue 82, attention against
// scaled_dot_product_attention): each run's region hands a partial sum of its own to the add
// both ran after it, whose sum is the same bits. `total`: that sum's bits in run B.
TraceBuilder partial_sums(bool other, uint8_t total = 0x40) {
  TraceBuilder t;
  const Phase bw = Phase::kBackward;
  for (uint64_t step = 0; step < 2; ++step) {
    t.step(step);
    int64_t x = t.op("aten::randn", bw).out_new(tensor(0x10, {16})).done();
    int64_t c = t.op("aten::neg", bw).in_ref(x).out_new(tensor(0x11, {16})).done();
    int64_t partial;
    if (!other) {
      partial = t.op("aten::mul", bw).in_ref(c).out_new(tensor(0x20, {16})).done();
    } else {
      int64_t d = t.op("aten::div", bw).in_ref(c).out_new(tensor(0x30, {16})).done();
      partial = t.op("aten::add", bw).in_ref(d).out_new(tensor(0x31, {16})).done();
    }
    int64_t sum = t.op("aten::add_", bw)
                      .in_ref(partial)
                      .in_ref(x)
                      .out_new(tensor(other ? total : 0x40, {16}))
                      .done();
    for (const char* op : {"aten::gelu", "aten::relu", "aten::abs", "aten::sigmoid"})
      sum =
          t.op(op, bw).in_ref(sum).out_new(tensor(other ? uint8_t(total + 1) : 0x41, {16})).done();
  }
  t.end();
  return t;
}

TEST(NumericsTest, GradientsSummedInAnotherOrderAreOneRegionToTheAddWhoseSumAgrees) {
  DiffReport r = diff_streams("partial_sums", partial_sums(false), partial_sums(true));
  ASSERT_EQ(r.structural.size(), 2u) << "one region a step";
  for (const StructuralDifference& d : r.structural) {
    ASSERT_TRUE(d.values) << d.detail;
    EXPECT_TRUE(d.values->same_bits()) << d.detail;
  }
  EXPECT_EQ(r.verdict, Verdict::kSameValues);
  EXPECT_EQ(r.divergent_ops, 0u) << "the add both ran is the region's";

  // A sum that differs too is no refactor: the region, as found, fails.
  DiffReport moved = diff_streams("partial_sums_moved", partial_sums(false),
                                  partial_sums(true, 0x50));
  EXPECT_EQ(moved.verdict, Verdict::kDivergent);
  EXPECT_EQ(gate_exit_code(moved), ExitCode::kDivergent);
}

// An op both ran whose kernel allocates by thread count (issue 82: LayerNorm's backward under
// Trainer on 1 and 2 threads): its inner resize_ differs, its outputs are the same bits.
TraceBuilder inner_allocation(int64_t threads) {
  TraceBuilder t;
  const Phase bw = Phase::kBackward;
  for (uint64_t step = 0; step < 2; ++step) {
    t.step(step);
    int64_t x = t.op("aten::randn", bw).out_new(tensor(0x10, {16})).done();
    t.op("aten::resize_", bw, 1).out_new(tensor(0x00, {threads, 16})).done();
    int64_t g =
        t.op("aten::native_layer_norm_backward", bw).in_ref(x).out_new(tensor(0x20, {16})).done();
    for (const char* op : {"aten::neg", "aten::abs", "aten::relu", "aten::sigmoid"})
      g = t.op(op, bw).in_ref(g).out_new(tensor(0x21, {16})).done();
  }
  t.end();
  return t;
}

TEST(NumericsTest, InnerOpsThatDifferInsideAnOpBothRanAreJudgedByItsValuesUnderATolerance) {
  DiffReport strict = diff_streams("inner_allocation", inner_allocation(1), inner_allocation(2));
  ASSERT_FALSE(strict.structural.empty());
  EXPECT_EQ(gate_exit_code(strict), ExitCode::kDivergent) << "bit for bit, the ops differ";
  DiffOptions o;
  o.gate = GateConfig{"tolerance", 0, 0};
  o.gate.ulp = 16;
  DiffReport tolerant = diff_streams("inner_allocation_t", inner_allocation(1), inner_allocation(2),
                                     o);
  EXPECT_TRUE(tolerant.structure_tolerated);
  EXPECT_FALSE(tolerant.beyond_tolerance);
  EXPECT_EQ(gate_exit_code(tolerant), ExitCode::kIdentical);
}

// A refactor's region and what reads its value after it (issue 82, Trainer's attention eager
// against sdpa). `how`: the value read through a view no op recorded (a transpose), so in
// other bytes; a 0.0 made by run B's region alone while the same bytes, made before the region
// or first seen after the backward began, are read later; run A's extra op, a mask, read by its
// region; or ops that return nothing (autograd's nodes for views).
enum class ReadAfter { kThroughAView, kOlderBytes, kLaterBytes, kExtraMask, kNoValues };

TraceBuilder read_after(bool other, ReadAfter how) {
  TraceBuilder t;
  for (uint64_t step = 0; step < 2; ++step) {
    t.step(step);
    const int64_t zero = t.op("aten::zeros").out_new(tensor(0x77, {1})).done();
    int64_t mask = -1;
    if (how == ReadAfter::kExtraMask && !other)
      mask = t.op("aten::tril").out_new(tensor(0x15, {16})).done();
    int64_t x = t.op("aten::layer_norm").out_new(tensor(0x10, {16})).done();
    for (const char* op : {"aten::gelu", "aten::sigmoid", "aten::tanh", "aten::silu"})
      x = t.op(op).in_ref(x).out_new(tensor(0x11, {16})).done();
    int64_t y;
    if (how == ReadAfter::kNoValues) {
      t.op(other ? "ViewBackward0" : "UnsafeViewBackward0").in_ref(x).done();
      y = x;
    } else if (!other) {
      auto op = t.op("aten::add");
      op.in_ref(x);
      if (mask >= 0) op.in_ref(mask);
      y = op.out_new(tensor(0x40, {16})).done();
    } else {
      int64_t m = t.op("aten::mul").in_ref(x).out_new(tensor(0x30, {16})).done();
      if (how == ReadAfter::kOlderBytes || how == ReadAfter::kLaterBytes)
        t.op("aten::scalar_tensor").out_new(tensor(0x77, {1})).done();
      y = t.op("aten::where").in_ref(m).out_new(tensor(0x40, {16})).done();
    }
    int64_t h = how == ReadAfter::kThroughAView
                    ? t.op("aten::clone")
                          .in_new(tensor(0x41, {16}, Provenance::kView), y)
                          .out_new(tensor(0x50, {16}))
                          .done()
                    : t.op("aten::clone").in_ref(y).out_new(tensor(0x50, {16})).done();
    for (const char* op : {"aten::relu", "aten::neg", "aten::abs", "aten::exp"})
      h = t.op(op).in_ref(h).out_new(tensor(0x60, {16})).done();
    if (how == ReadAfter::kOlderBytes) t.op("aten::add_").in_ref(zero).in_ref(h).done();
    if (how == ReadAfter::kLaterBytes) {
      t.op("aten::sum", Phase::kBackward).in_ref(h).out_new(tensor(0x61, {1})).done();
      t.op("aten::add_").in_new(tensor(0x77, {1}, Provenance::kExternal)).done();
    }
  }
  t.end();
  return t;
}

TEST(NumericsTest, WhatARegionHandsOnIsReadByDataFlowNotByBytesAlone) {
  const std::vector<std::pair<ReadAfter, const char*>> cases = {
      {ReadAfter::kThroughAView, "view"},
      {ReadAfter::kOlderBytes, "older"},
      {ReadAfter::kLaterBytes, "later"},
      {ReadAfter::kExtraMask, "mask"},
      {ReadAfter::kNoValues, "no_values"}};
  for (const auto& [how, name] : cases) {
    DiffReport r = diff_streams(std::string("read_after_") + name, read_after(false, how),
                                read_after(true, how));
    ASSERT_FALSE(r.structural.empty()) << name;
    for (const StructuralDifference& d : r.structural) EXPECT_TRUE(d.same_bits()) << d.detail;
    EXPECT_EQ(r.verdict, Verdict::kSameValues) << name;
    EXPECT_EQ(gate_exit_code(r), ExitCode::kIdentical) << name;
  }
}

// The same torch build on two GPU models: a cuBLAS GEMM on cuda:1 reads the same inputs and
// writes other bits.
TraceBuilder gpu_gemm(uint8_t out) {
  auto on_gpu = [](TensorDesc t) {
    t.device_type = 1;  // c10::DeviceType::CUDA
    t.device_index = 1;
    return t;
  };
  TraceBuilder t;
  t.step(0);
  int64_t y = t.op("aten::mm")
                  .in_new(on_gpu(tensor(0x10)))
                  .in_new(on_gpu(tensor(0x11)))
                  .out_new(on_gpu(tensor(out)))
                  .done();
  t.op("aten::relu").in_ref(y).out_new(on_gpu(tensor(uint8_t(out + 1)))).done();
  t.end();
  return t;
}

nlohmann::json gpu_env(const char* gpu1, int sms, const char* cublas) {
  nlohmann::json j = sample_env(1, 7);
  j["cuda"] = {{"available", true},
               {"initialized", true},
               {"device_count", 2},
               {"cublas_version", cublas},
               {"devices",
                {{"0", {{"name", "NVIDIA H100 80GB HBM3"}, {"sm_count", 132}}},
                 {"1", {{"name", gpu1}, {"sm_count", sms}}}}}};
  return j;
}

TEST(NumericsTest, AGpuOpIsTiedToItsGpuModelAndTheLibraryThatComputesIt) {
  RunDir a("numerics_gpu/run-0"), b("numerics_gpu/run-1");
  a.add_stream("r0.main.t0", gpu_gemm(0x20));
  b.add_stream("r0.main.t0", gpu_gemm(0x40));
  a.env("r0.main", gpu_env("NVIDIA H100 80GB HBM3", 132, "12.9.1"));
  b.env("r0.main", gpu_env("NVIDIA A100-SXM4-80GB", 108, "12.9.1"));
  DiffOptions o;
  DiffReport r;
  ASSERT_TRUE(diff_runs(a.path(), b.path(), o, &r).ok());
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kNondeterministicOp);
  // The op's own GPU (cuda:1) named, not only the first CUDA difference listed.
  EXPECT_NE(r.first->explanation.cause.find("cuda.devices.1.name differs"), std::string::npos)
      << r.first->explanation.cause;
  EXPECT_NE(r.first->explanation.cause.find("aten::mm is computed by cuBLAS (a GPU GEMM)"),
            std::string::npos)
      << r.first->explanation.cause;
  EXPECT_NE(r.first->explanation.remedy.find("same GPU model"), std::string::npos)
      << r.first->explanation.remedy;

  // The same GPUs, another cuBLAS: the library's version is the suspect.
  a.env("r0.main", gpu_env("NVIDIA A100-SXM4-80GB", 108, "12.9.1"));
  b.env("r0.main", gpu_env("NVIDIA A100-SXM4-80GB", 108, "13.0.2"));
  DiffReport lib;
  ASSERT_TRUE(diff_runs(a.path(), b.path(), o, &lib).ok());
  ASSERT_TRUE(lib.first);
  EXPECT_NE(lib.first->explanation.cause.find("cuda.cublas_version differs"), std::string::npos)
      << lib.first->explanation.cause;
}

}  // namespace
}  // namespace detaudit
