#include "process/environment.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <dlfcn.h>
#include <link.h>
#include <torch/version.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string_view>
#include <type_traits>

#include "run_layout.h"
#include "tensors/tensor_digest.h"
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
  static const UnaryOp kVmlOps[] = {at::acos,   at::asin, at::atan, at::cos,   at::erf,  at::erfc,
                                    at::erfinv, at::exp,  at::log,  at::log10, at::log2, at::sin,
                                    at::sqrt,   at::tan,  at::tanh, at::trunc};
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

namespace {

// --- CUDA, read without initializing it ------------------------------------------------------
// The interposer is built against CPU torches too, and must never start CUDA in a program that
// did not (a DataLoader forks its workers; a forked child cannot use CUDA its parent started).
// So nothing here calls the CUDA runtime or torch's CUDA hooks: CUDA's libraries are looked up
// among those already mapped, and the driver is asked only once cuInit has run.

// A handle on an already-mapped library whose file name starts with `prefix` ("libcudnn.so"),
// or null. RTLD_NOLOAD: never maps one.
void* mapped_library(std::string_view prefix) {
  struct Search {
    std::string_view prefix;
    std::string path;
  } search{prefix, {}};
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* data) -> int {
        auto* s = static_cast<Search*>(data);
        if (!info->dlpi_name || !*info->dlpi_name) return 0;
        std::string_view path = info->dlpi_name;
        std::string_view file = path.substr(path.rfind('/') + 1);
        if (file.substr(0, s->prefix.size()) != s->prefix) return 0;
        s->path = std::string(path);
        return 1;
      },
      &search);
  return search.path.empty() ? nullptr : ::dlopen(search.path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
}

// A function of an already-mapped library, with its handle closed again by the caller's scope.
class MappedSymbols {
 public:
  explicit MappedSymbols(std::string_view prefix) : handle_(mapped_library(prefix)) {}
  ~MappedSymbols() {
    if (handle_) ::dlclose(handle_);
  }
  MappedSymbols(const MappedSymbols&) = delete;
  MappedSymbols& operator=(const MappedSymbols&) = delete;
  explicit operator bool() const { return handle_ != nullptr; }
  template <typename F>
  F get(const char* name) const {
    return handle_ ? reinterpret_cast<F>(::dlsym(handle_, name)) : nullptr;
  }

 private:
  void* handle_;
};

// The driver API's few calls used here (cuda.h), with CUdevice an int and CUresult 0 on success.
using CuIntFn = int (*)(int*);
using CuDeviceGetFn = int (*)(int*, int);
using CuDeviceGetNameFn = int (*)(char*, int, int);
using CuDeviceGetAttributeFn = int (*)(int*, int, int);
constexpr int kCuAttrMultiprocessorCount = 16;  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
constexpr int kCuAttrCcMajor = 75;              // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kCuAttrCcMinor = 76;              // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR

// The process that was seen with CUDA initialized: it stays so (0: not seen). A forked child
// asks again: CUDA its parent started does not work in it.
std::atomic<pid_t> g_cuda_seen_in{0};

// The version a library reports through `int f(int*)`-style or `size_t f()` getters; null where
// the library is not mapped or lacks the function.
nlohmann::json int_getter(std::string_view library, const char* fn) {
  MappedSymbols lib(library);
  if (auto f = lib.get<CuIntFn>(fn)) {
    int v = 0;
    if (f(&v) == 0) return v;
  }
  return nullptr;
}

nlohmann::json size_getter(std::string_view library, const char* fn) {
  MappedSymbols lib(library);
  if (auto f = lib.get<size_t (*)()>(fn)) return f();
  return nullptr;
}

// cuBLAS's own version (CUBLAS_VERSION numbering, major*10000 + minor*100 + patch), else cuBLASLt's.
nlohmann::json cublas_version() {
  MappedSymbols cublas("libcublas.so");
  if (auto property = cublas.get<int (*)(int, int*)>("cublasGetProperty")) {
    int major = 0, minor = 0,
        patch = 0;  // libraryPropertyType: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
    if (property(0, &major) == 0 && property(1, &minor) == 0 && property(2, &patch) == 0)
      return major * 10000 + minor * 100 + patch;
  }
  return size_getter("libcublasLt.so", "cublasLtGetVersion");
}

// torch 1.13 returns a bool; 2.x a CuBLASReductionOption (0 = reduced precision with split-K,
// 1 = no reduced precision but split-K, 2 = neither). Recorded as what it allows.
template <typename T>
nlohmann::json reduction_flag(T v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v;
  } else {
    const int option = int(v);
    return {{"reduced_precision", option == 0}, {"split_k", option != 2}};
  }
}

template <typename C>
auto bf16_reduction(const C& ctx, int) -> decltype(reduction_flag(ctx.allowBF16ReductionCuBLAS())) {
  return reduction_flag(ctx.allowBF16ReductionCuBLAS());
}
template <typename C>
nlohmann::json bf16_reduction(const C&, long) {
  return nullptr;  // torch 1.13 has no such flag
}

// What a torch's CUDA state is, read only where CUDA is up already.
nlohmann::json cuda_fingerprint() {
  nlohmann::json j;
  const bool built = bool(MappedSymbols("libtorch_cuda.so")) ||
                     bool(MappedSymbols("libc10_cuda.so"));
  j["built"] = built;
  const bool initialized = built && cuda_initialized();
  j["initialized"] = initialized;
  // "available": false without a CUDA build; not known (null) until the program starts CUDA.
  j["available"] = built ? nlohmann::json(nullptr) : nlohmann::json(false);
  if (!initialized) return j;

  MappedSymbols driver("libcuda.so");
  auto count_fn = driver.get<CuIntFn>("cuDeviceGetCount");
  auto get_fn = driver.get<CuDeviceGetFn>("cuDeviceGet");
  auto name_fn = driver.get<CuDeviceGetNameFn>("cuDeviceGetName");
  auto attr_fn = driver.get<CuDeviceGetAttributeFn>("cuDeviceGetAttribute");
  int count = 0;
  if (count_fn && count_fn(&count) != 0) count = 0;
  j["available"] = count > 0;
  j["device_count"] = count;
  // Keyed by ordinal, so that a difference names its field: cuda.devices.0.sm_count.
  nlohmann::json devices = nlohmann::json::object();
  for (int i = 0; i < count && get_fn && name_fn && attr_fn; ++i) {
    int dev = 0;
    if (get_fn(&dev, i) != 0) continue;
    char name[256] = {};
    nlohmann::json d;
    d["name"] = name_fn(name, int(sizeof name) - 1, dev) == 0 ? nlohmann::json(name)
                                                              : nlohmann::json(nullptr);
    int major = 0, minor = 0, sms = 0;
    d["compute_capability"] = attr_fn(&major, kCuAttrCcMajor, dev) == 0 &&
                                      attr_fn(&minor, kCuAttrCcMinor, dev) == 0
                                  ? nlohmann::json(std::to_string(major) + "." +
                                                   std::to_string(minor))
                                  : nlohmann::json(nullptr);
    d["sm_count"] = attr_fn(&sms, kCuAttrMultiprocessorCount, dev) == 0 ? nlohmann::json(sms)
                                                                        : nlohmann::json(nullptr);
    devices[std::to_string(i)] = d;
  }
  j["devices"] = devices;
  j["driver_version"] = int_getter("libcuda.so", "cuDriverGetVersion");
  // Not "runtime_version": the diff takes keys with "time" in them for clocks and skips them.
  j["cudart_version"] = int_getter("libcudart.so", "cudaRuntimeGetVersion");
  j["cudnn_version"] = size_getter("libcudnn.so", "cudnnGetVersion");
  j["cublas_version"] = cublas_version();
  j["nccl_version"] = int_getter("libnccl.so", "ncclGetVersion");
  return j;
}

// The fingerprint last written by this process without CUDA started: rewritten at exit if the
// program started CUDA since (write_environment runs at the first op, often before it does).
std::mutex g_env_mu;
std::string g_env_path_without_cuda;
pid_t g_env_pid = 0;

}  // namespace

bool cuda_initialized() {
  const pid_t self = ::getpid();
  if (g_cuda_seen_in.load(std::memory_order_relaxed) == self) return true;
  // libcuda is mapped by the CUDA runtime when it starts; without cuInit, the driver's calls
  // answer CUDA_ERROR_NOT_INITIALIZED and do nothing.
  MappedSymbols driver("libcuda.so");
  auto count_fn = driver.get<CuIntFn>("cuDeviceGetCount");
  int count = 0;
  if (!count_fn || count_fn(&count) != 0) return false;
  g_cuda_seen_in.store(self, std::memory_order_relaxed);
  return true;
}

uint64_t cuda_rng_digest(int device_index) {
  at::RecordFunctionGuard no_recording(false);
  try {
    // Host-side state only: CUDAGeneratorImpl::get_state() copies the seed and the Philox
    // offset into a CPU tensor, with no device work and no sync.
    return generator_digest(at::globalContext().defaultGenerator(
        at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index))));
  } catch (...) {
    return 0;  // inside CUDA graph capture the generator refuses to be read
  }
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
    "CUBLAS_WORKSPACE_CONFIG",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "MKL_CBWR",
    "MKL_DYNAMIC",
    "OMP_DYNAMIC",
    "PYTHONHASHSEED",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "LD_PRELOAD",
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

void write_environment(const std::string& path, const ProcessFacts& process) {
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
      {"allow_fp16_reduction_cublas", reduction_flag(ctx.allowFP16ReductionCuBLAS())},
      {"allow_bf16_reduction_cublas", bf16_reduction(ctx, 0)},
  };
  j["mkl"] = at::hasMKL();
  nlohmann::json env = nlohmann::json::object();
  for (const char* var : kEnvVars) {
    const char* v = std::getenv(var);
    env[var] = v ? nlohmann::json(v) : nlohmann::json(nullptr);
  }
  j["env"] = env;
  // Not ctx.hasCUDA(): it counts devices, which starts CUDA.
  j["cuda"] = cuda_fingerprint();
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  j["host"] = host;
  const char* node = std::getenv(layout::kEnvNode);
  j["node"] = node ? nlohmann::json(node) : nlohmann::json(nullptr);
  j["pid"] = ::getpid();
  j["rank"] = process.rank;
  const char* world = std::getenv("WORLD_SIZE");
  if (!world) world = std::getenv("SLURM_NTASKS");  // srun's tasks, one a rank
  j["world_size"] = world ? std::atoi(world) : 1;
  j["process_role"] = process.role;
  j["command_line"] = command_line();
  j["python"] = process.python;
  j["digest"] = std::string(trace::digest_name(process.digest));
  j["build_config"] = at::show_config();
  // Readers see the old file or the new one, never half of one (it is rewritten at exit).
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    if (!out.flush()) return;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return;
  }
  std::lock_guard<std::mutex> lock(g_env_mu);
  g_env_pid = ::getpid();
  g_env_path_without_cuda = j["cuda"]["built"].get<bool>() && !j["cuda"]["initialized"].get<bool>()
                                ? path
                                : std::string();
}

void rewrite_environment_if_cuda_started(const ProcessFacts& process) {
  std::string path;
  {
    std::lock_guard<std::mutex> lock(g_env_mu);
    if (g_env_pid != ::getpid() || g_env_path_without_cuda.empty()) return;
    path = g_env_path_without_cuda;
  }
  if (cuda_initialized()) write_environment(path, process);
}

}  // namespace detaudit::hooks
