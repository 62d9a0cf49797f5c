#include "environment.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <dlfcn.h>
#include <torch/version.h>
#include <unistd.h>

#include <fstream>

#include "recorder.h"
#include "tensor_digest.h"
#include "trace/format.h"

namespace detaudit::hooks {

std::string torch_version() { return TORCH_VERSION; }

namespace {

bool g_mkl_vml_warmed_up = false;

// oneMKL resolves each VML function's kernel on its first call, without a lock: intra-op threads
// that make that first call together can run a low-accuracy kernel on their chunk
// (pytorch#188792, oneMKL 2024.2 in torch's wheels). One serial call of every function ATen
// routes to VML resolves them before the program runs; later calls compute what they would have.
bool warm_up_mkl_vml() {
  if (!at::hasMKL()) return false;
  at::RecordFunctionGuard no_recording(false);
  using UnaryOp = at::Tensor (*)(const at::Tensor&);
  static const UnaryOp kVmlOps[] = {at::acos, at::asin,  at::atan, at::cos,  at::erf,   at::erfc,
                                    at::erfinv, at::exp, at::log,  at::log10, at::log2, at::sin,
                                    at::sqrt, at::tan,   at::tanh, at::trunc};
  // 16 elements: contiguous, so ATen hands them to VML, and under any grain size, so serial.
  for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    at::Tensor x = at::full({16}, 0.5, at::TensorOptions().dtype(dtype));
    for (UnaryOp op : kVmlOps) op(x);
  }
  return true;
}

}  // namespace

std::string apply_determinism(const DeterminismConfig& config) {
  std::string done;
  if (config.seed) {
    at::manual_seed(*config.seed);
    done += " seed=" + std::to_string(*config.seed);
  }
  if (!config.algorithms.empty()) {
    at::globalContext().setDeterministicAlgorithms(config.algorithms != "off",
                                                   config.algorithms == "warn");
    done += " deterministic_algorithms=" + config.algorithms;
  }
  if (config.intra_op_threads) {
    at::set_num_threads(*config.intra_op_threads);
    done += " intra_op_threads=" + std::to_string(*config.intra_op_threads);
  }
  if (config.mkl_vml_warm_up && warm_up_mkl_vml()) {
    g_mkl_vml_warmed_up = true;
    done += " mkl_vml_warm_up";
  }
  return done;
}

uint32_t determinism_bits() {
  auto& ctx = at::globalContext();
  uint32_t bits = 0;
  if (ctx.deterministicAlgorithms()) bits |= trace::kDetAlgorithms;
  if (ctx.deterministicAlgorithmsWarnOnly()) bits |= trace::kDetWarnOnly;
  if (ctx.deterministicCuDNN()) bits |= trace::kDetCudnn;
  if (ctx.benchmarkCuDNN()) bits |= trace::kBenchmarkCudnn;
  if (ctx.allowTF32CuBLAS()) bits |= trace::kAllowTf32Cublas;
  if (ctx.allowTF32CuDNN()) bits |= trace::kAllowTf32Cudnn;
  return bits;
}

uint64_t default_rng_digest() {
  // get_state() runs tensor ops: keep them out of the trace.
  at::RecordFunctionGuard no_recording(false);
  try {
    return generator_digest(at::detail::getDefaultCPUGenerator());
  } catch (...) {
    return 0;
  }
}

namespace {

const char* kEnvVars[] = {
    "CUBLAS_WORKSPACE_CONFIG", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_CBWR", "MKL_DYNAMIC",
    "OMP_DYNAMIC", "PYTHONHASHSEED", "NCCL_ALGO", "NCCL_PROTO", "CUDA_LAUNCH_BLOCKING",
    "CUDA_VISIBLE_DEVICES", "NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LD_PRELOAD",
};

std::string matmul_precision() {
  switch (at::globalContext().float32MatmulPrecision()) {
    case at::Float32MatmulPrecision::HIGHEST: return "highest";
    case at::Float32MatmulPrecision::HIGH: return "high";
    case at::Float32MatmulPrecision::MEDIUM: return "medium";
  }
  return "unknown";
}

nlohmann::json command_line() {
  nlohmann::json argv = nlohmann::json::array();
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string arg;
  while (std::getline(in, arg, '\0')) argv.push_back(arg);
  return argv;
}

}  // namespace

void write_environment(const std::string& path, const ProcessRecorder& proc) {
  at::RecordFunctionGuard no_recording(false);
  auto& ctx = at::globalContext();
  nlohmann::json j;
  j["torch_version"] = torch_version();
  j["intra_op_threads"] = at::get_num_threads();
  j["inter_op_threads"] = at::get_num_interop_threads();
  j["determinism"] = {
      {"deterministic_algorithms", ctx.deterministicAlgorithms()},
      {"warn_only", ctx.deterministicAlgorithmsWarnOnly()},
      {"deterministic_cudnn", ctx.deterministicCuDNN()},
      {"benchmark_cudnn", ctx.benchmarkCuDNN()},
      {"allow_tf32_cublas", ctx.allowTF32CuBLAS()},
      {"allow_tf32_cudnn", ctx.allowTF32CuDNN()},
      {"float32_matmul_precision", matmul_precision()},
      {"mkl_vml_warm_up", g_mkl_vml_warmed_up},
  };
  j["mkl"] = at::hasMKL();
  nlohmann::json env = nlohmann::json::object();
  for (const char* var : kEnvVars) {
    const char* v = std::getenv(var);
    env[var] = v ? nlohmann::json(v) : nlohmann::json(nullptr);
  }
  j["env"] = env;
  j["cuda"] = {{"available", ctx.hasCUDA()}};
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  j["host"] = host;
  j["pid"] = ::getpid();
  j["rank"] = proc.rank();
  const char* world = std::getenv("WORLD_SIZE");
  j["world_size"] = world ? std::atoi(world) : 1;
  j["process_role"] = proc.role();
  j["command_line"] = command_line();
  j["python"] = proc.is_python();
  j["digest"] = std::string(trace::digest_name(proc.config().digest));
  j["build_config"] = at::show_config();
  std::ofstream(path) << j.dump(2) << "\n";
}

}  // namespace detaudit::hooks
