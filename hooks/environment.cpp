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
  };
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
