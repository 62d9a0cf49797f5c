// CUDA state, tested on the CPU: which generator a random op's recorded state comes from, a CUDA
// dropout whose generator state differs, and differences of the GPU, its libraries and settings
// named as the cause.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "../../hooks/ops/rng_source.h"
#include "catalog/catalog.h"
#include "diff/diff.h"
#include "diff/report_model.h"
#include "report_printers.h"
#include "trace_builder.h"

namespace detaudit {
namespace {

using namespace detaudit::testing;
using hooks::RngArg;
using hooks::RngSource;

// --- which generator ----------------------------------------------------------------------------

RngArg tensor_on(int type, int index) { return {RngArg::What::kTensor, type, index}; }
RngArg device_arg(int type, int index) { return {RngArg::What::kDevice, type, index}; }
RngArg generator() { return {RngArg::What::kGenerator, 0, -1}; }
RngArg other() { return {}; }

RngSource source_of(const std::vector<RngArg>& args) {
  return hooks::rng_source(args.size(), [&](size_t i) { return args[i]; });
}

constexpr int kCpu = 0, kCuda = 1;

TEST(RngSourceTest, ACudaDropoutDrawsFromItsDevicesGenerator) {
  // native_dropout(Tensor input, float p, bool? train): no Generator argument.
  RngSource s = source_of({tensor_on(kCuda, 1), other(), other()});
  EXPECT_EQ(s.kind, RngSource::Kind::kCuda);
  EXPECT_EQ(s.device_index, 1);
  EXPECT_FALSE(s.from_device_arg);
}

TEST(RngSourceTest, CpuTensorsDrawFromTheCpuGenerator) {
  EXPECT_EQ(source_of({tensor_on(kCpu, -1), other(), other()}).kind, RngSource::Kind::kCpu);
  EXPECT_EQ(source_of({}).kind, RngSource::Kind::kCpu);
}

TEST(RngSourceTest, AnExplicitGeneratorWins) {
  // bernoulli_(Tensor self, float p, Generator? generator) on CUDA with a Generator passed.
  RngSource s = source_of({tensor_on(kCuda, 0), other(), generator()});
  EXPECT_EQ(s.kind, RngSource::Kind::kExplicit);
  EXPECT_EQ(s.arg, 2u);
}

TEST(RngSourceTest, TheFirstCudaTensorNamesTheDevice) {
  // A CPU tensor (a wrapped scalar) before the CUDA one does not make it a CPU op.
  RngSource s = source_of({tensor_on(kCpu, -1), tensor_on(kCuda, 3), tensor_on(kCuda, 0)});
  EXPECT_EQ(s.kind, RngSource::Kind::kCuda);
  EXPECT_EQ(s.device_index, 3);
}

TEST(RngSourceTest, ADeviceArgumentSaysWhereTheOpDraws) {
  // rand(size, dtype, layout, device='cuda'): no tensor at all.
  RngSource s = source_of({other(), other(), other(), device_arg(kCuda, -1)});
  EXPECT_EQ(s.kind, RngSource::Kind::kCuda);
  EXPECT_EQ(s.device_index, -1);
  EXPECT_TRUE(s.from_device_arg);
  // randn_like(cuda_tensor, device='cpu') makes and draws on the CPU.
  EXPECT_EQ(source_of({tensor_on(kCuda, 0), other(), device_arg(kCpu, -1)}).kind,
            RngSource::Kind::kCpu);
}

// --- a CUDA dropout whose generator state differs -----------------------------------------------

TensorDesc on_cuda(TensorDesc t, int index = 0) {
  t.device_type = 1;
  t.device_index = int64_t(index);
  return t;
}

// linear on CUDA, then dropout (native_dropout: output and bool mask), then a sum that reads it.
// `rng` is the digest of the CUDA generator's state (seed, Philox offset) the recorder took.
TraceBuilder dropout_run(uint64_t rng, uint8_t dropped, bool random = true) {
  TraceBuilder t;
  t.step(0);
  int64_t x = t.op("aten::linear")
                  .in_new(on_cuda(tensor(0x10, {8, 8}, Provenance::kExternal)))
                  .in_new(on_cuda(tensor(0x11, {8, 8})))
                  .out_new(on_cuda(tensor(0x12, {8, 8})))
                  .done();
  auto drop = t.op("aten::native_dropout");
  if (random) drop.random(rng);
  drop.in_ref(x).in_double(0.5).in_bool(true).out_new(on_cuda(tensor(dropped, {8, 8})));
  int64_t y = drop.last_id();
  drop.out_new(on_cuda(tensor(uint8_t(dropped + 1), {8, 8}, Provenance::kOutput, Dtype::kBool)))
      .done();
  t.op("aten::sum").in_ref(y).out_new(on_cuda(tensor(uint8_t(dropped + 2), {}))).done();
  t.end();
  return t;
}

DiffReport diff(const RunDir& a, const RunDir& b) {
  static Catalog catalog = [] {
    Catalog c;
    Status s = Catalog::load(std::string(DETAUDIT_SOURCE_DIR) + "/configs/catalog.json", &c);
    EXPECT_TRUE(s.ok()) << s.message();
    return c;
  }();
  DiffOptions o;
  o.catalog = &catalog;
  DiffReport r;
  Status s = diff_runs(a.path(), b.path(), o, &r);
  EXPECT_TRUE(s.ok()) << s.message();
  return r;
}

TEST(CudaStateTest, ACudaDropoutWithAnotherGeneratorStateIsRngState) {
  RunDir a("cuda_dropout/run-0"), b("cuda_dropout/run-1");
  a.add_stream("r0.main.t-main", dropout_run(0x1111, 0x40));
  b.add_stream("r0.main.t-main", dropout_run(0x2222, 0x50));
  DiffReport r = diff(a, b);
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->op, "aten::native_dropout");
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kRngState) << r.first->evidence.detail;
  EXPECT_TRUE(r.first->evidence.is_random);
  EXPECT_EQ(r.first->evidence.rng_a, 0x1111u);
  EXPECT_EQ(r.first->evidence.rng_b, 0x2222u);
  ASSERT_FALSE(r.first->evidence.outputs.empty());
  EXPECT_EQ(r.first->evidence.outputs[0].a.device, "cuda:0");
  // The cause names the generator the kernel drew from, and the remedy seeds it.
  EXPECT_NE(r.first->explanation.cause.find("CUDA generator of cuda:0"), std::string::npos)
      << r.first->explanation.cause;
  EXPECT_NE(r.first->explanation.remedy.find("CUDA device"), std::string::npos)
      << r.first->explanation.remedy;
}

TEST(CudaStateTest, ACudaDropoutWithTheSameGeneratorStateIsNotRngState) {
  // The same recorded state and different outputs: the state explains nothing.
  RunDir a("cuda_dropout_same/run-0"), b("cuda_dropout_same/run-1");
  a.add_stream("r0.main.t-main", dropout_run(0x1111, 0x40));
  b.add_stream("r0.main.t-main", dropout_run(0x1111, 0x50));
  DiffReport r = diff(a, b);
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->op, "aten::native_dropout");
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kNondeterministicOp)
      << r.first->evidence.detail;
}

// --- the GPU, its libraries and settings as the cause -------------------------------------------

nlohmann::json cuda_env(int pid) {
  nlohmann::json j = sample_env(1, pid);
  j["determinism"]["allow_tf32_cublas"] = false;
  j["determinism"]["allow_fp16_reduction_cublas"] = {{"reduced_precision", true},
                                                     {"split_k", true}};
  j["env"]["CUBLAS_WORKSPACE_CONFIG"] = nullptr;
  j["cuda"] = {
      {"built", true},
      {"initialized", true},
      {"available", true},
      {"device_count", 1},
      {"devices",
       {{"0",
         {{"name", "NVIDIA H100 80GB HBM3"}, {"compute_capability", "9.0"}, {"sm_count", 132}}}}},
      {"driver_version", 13000},
      {"cudart_version", 13000},
      {"cudnn_version", 91002},
      {"cublas_version", 130100},
      {"nccl_version", 22703}};
  return j;
}

// Runs whose only difference is a CUDA op's output (not in the catalog) and `change` applied
// to run B's fingerprint.
DiffReport diff_with_env(const std::string& name,
                         const std::function<void(nlohmann::json&)>& change, bool on_gpu = true) {
  auto run = [&](uint8_t out) {
    TraceBuilder t;
    t.step(0);
    TensorDesc in = tensor(0x10, {8, 8}, Provenance::kExternal), res = tensor(out, {8, 8});
    if (on_gpu) {
      in = on_cuda(in);
      res = on_cuda(res);
    }
    int64_t y = t.op("aten::mul").in_new(in).in_double(2.0).out_new(res).done();
    t.op("aten::sum").in_ref(y).out_new(tensor(uint8_t(out + 1), {})).done();
    t.end();
    return t;
  };
  RunDir a(name + "/run-0"), b(name + "/run-1");
  a.add_stream("r0.main.t-main", run(0x20));
  b.add_stream("r0.main.t-main", run(0x21));
  nlohmann::json ea = cuda_env(11), eb = cuda_env(22);
  change(eb);
  a.env("r0.main", ea);
  b.env("r0.main", eb);
  return diff(a, b);
}

TEST(CudaStateTest, ACudnnVersionDifferenceIsNamedAsTheCause) {
  DiffReport r = diff_with_env("cudnn_version",
                               [](nlohmann::json& j) { j["cuda"]["cudnn_version"] = 90100; });
  ASSERT_EQ(r.environment.size(), 1u);
  EXPECT_EQ(r.environment[0].key, "cuda.cudnn_version");
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->divergence_class, DivergenceClass::kNondeterministicOp);
  EXPECT_EQ(r.first->explanation.cause, "cuda.cudnn_version differs: 91002 vs 90100");
  EXPECT_NE(r.first->explanation.remedy.find("cuDNN"), std::string::npos)
      << r.first->explanation.remedy;
}

TEST(CudaStateTest, EachGpuAndLibraryFieldIsNamedAsTheCause) {
  const std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>> cases = {
      {"cuda.devices.0.name",
       [](nlohmann::json& j) { j["cuda"]["devices"]["0"]["name"] = "NVIDIA A100"; }},
      {"cuda.devices.0.compute_capability",
       [](nlohmann::json& j) { j["cuda"]["devices"]["0"]["compute_capability"] = "8.0"; }},
      {"cuda.devices.0.sm_count",
       [](nlohmann::json& j) { j["cuda"]["devices"]["0"]["sm_count"] = 108; }},
      {"cuda.driver_version", [](nlohmann::json& j) { j["cuda"]["driver_version"] = 12080; }},
      {"cuda.cudart_version", [](nlohmann::json& j) { j["cuda"]["cudart_version"] = 12080; }},
      {"cuda.cublas_version", [](nlohmann::json& j) { j["cuda"]["cublas_version"] = 120800; }},
      {"cuda.nccl_version", [](nlohmann::json& j) { j["cuda"]["nccl_version"] = 22105; }},
      {"determinism.allow_tf32_cublas",
       [](nlohmann::json& j) { j["determinism"]["allow_tf32_cublas"] = true; }},
      {"determinism.benchmark_cudnn",
       [](nlohmann::json& j) { j["determinism"]["benchmark_cudnn"] = true; }},
      {"determinism.allow_fp16_reduction_cublas.reduced_precision",
       [](nlohmann::json& j) {
         j["determinism"]["allow_fp16_reduction_cublas"]["reduced_precision"] = false;
       }},
      {"env.CUBLAS_WORKSPACE_CONFIG",
       [](nlohmann::json& j) { j["env"]["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"; }},
  };
  for (const auto& [key, change] : cases) {
    DiffReport r = diff_with_env("cuda_field", change);
    ASSERT_TRUE(r.first) << key;
    EXPECT_EQ(r.first->explanation.cause.rfind(key + " differs: ", 0), 0u)
        << key << ": " << r.first->explanation.cause;
  }
}

TEST(CudaStateTest, WhetherCudaWasUpWhenTheFingerprintWasWrittenIsNotACause) {
  // Run B's process died before its fingerprint was rewritten with CUDA up.
  DiffReport r = diff_with_env("cuda_not_initialized", [](nlohmann::json& j) {
    j["cuda"] = {{"built", true}, {"initialized", false}, {"available", nullptr}};
  });
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->explanation.cause.find("cuda.initialized"), std::string::npos)
      << r.first->explanation.cause;
  EXPECT_EQ(r.first->explanation.cause.find("cuda.available"), std::string::npos)
      << r.first->explanation.cause;
}

TEST(CudaStateTest, AGpuDifferenceIsNotTheCauseOfACpuOpsDifference) {
  DiffReport r = diff_with_env(
      "cuda_field_cpu_op", [](nlohmann::json& j) { j["cuda"]["cudnn_version"] = 90100; },
      /*on_gpu=*/false);
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->explanation.cause.find("cudnn_version"), std::string::npos)
      << r.first->explanation.cause;
}

}  // namespace
}  // namespace detaudit
