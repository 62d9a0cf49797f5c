// The likely cause and its remedy, from the class, the catalog entry and the environment
// differences: explanations read the classification and never change it.
#include "diff/explain.h"

#include <fmt/format.h>

#include <algorithm>

#include "diff/evidence.h"

namespace detaudit {
namespace {

// A key one fingerprint lacks is another torch's (or detaudit's) fingerprint, not a setting
// that differs: never a cause by itself.
bool a_setting_differs(const EnvDifference& d) { return d.a != "(absent)" && d.b != "(absent)"; }

const EnvDifference* find_env(const std::vector<EnvDifference>& env,
                              std::initializer_list<const char*> keys) {
  // "intra_op_threads (step 3)" matches "intra_op_threads".
  for (const EnvDifference& d : env)
    if (a_setting_differs(d))
      for (std::string_view k : keys)
        if (d.key.compare(0, k.size(), k) == 0 &&
            (d.key.size() == k.size() || d.key[k.size()] == ' '))
          return &d;
  return nullptr;
}

const EnvDifference* find_env_containing(const std::vector<EnvDifference>& env,
                                         std::initializer_list<const char*> parts) {
  for (const EnvDifference& d : env)
    if (a_setting_differs(d))
      for (const char* p : parts)
        if (d.key.find(p) != std::string::npos) return &d;
  return nullptr;
}

// The torch builds differ: their versions, else their commits (two builds of one version).
const EnvDifference* find_torch_build(const std::vector<EnvDifference>& env) {
  for (const char* key : {"torch_version", "build_config.COMMIT_SHA"})
    for (const EnvDifference& d : env)
      if (d.key == key) return &d;
  return nullptr;
}

const EnvDifference* find_key(const std::vector<EnvDifference>& env, std::string_view part) {
  for (const EnvDifference& d : env)
    if (d.key.find(part) != std::string::npos) return &d;
  return nullptr;
}

// The library that computes an op, where the build names it: "the BLAS library (BLAS_INFO)".
struct Implementer {
  std::string what;              // "the BLAS library"
  const EnvDifference* version;  // how it differs between the builds; null when it does not
};

bool op_or_chain_is(const FirstDivergence& fd, std::initializer_list<std::string_view> names) {
  auto is = [&](std::string_view op) {
    for (std::string_view n : names)
      if (op == n) return true;
    return false;
  };
  if (is(fd.op)) return true;
  for (const std::string& c : fd.chain)
    if (is(c)) return true;
  return false;
}

Implementer implementer_of(const FirstDivergence& fd, bool cpu,
                           const std::vector<EnvDifference>& env) {
  const bool gemm = op_or_chain_is(
      fd, {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::matmul",
           "aten::linear", "aten::addmv", "aten::mv", "aten::dot", "aten::_addmm_activation",
           "aten::einsum", "aten::tensordot"});
  const bool conv = op_or_chain_is(
      fd, {"aten::convolution", "aten::_convolution", "aten::conv1d", "aten::conv2d",
           "aten::conv3d", "aten::mkldnn_convolution", "aten::convolution_backward",
           "aten::cudnn_convolution", "aten::_slow_conv2d_forward", "aten::conv_transpose2d"});
  if (cpu && gemm) {
    const EnvDifference* v = find_key(env, "build_config.BLAS_INFO");
    if (!v) v = find_key(env, "Math Kernel Library");
    return {"the BLAS library (a CPU GEMM)", v};
  }
  if (cpu && conv) return {"oneDNN (MKL-DNN, a CPU convolution)", find_key(env, "MKL-DNN")};
  if (!cpu && gemm) return {"cuBLAS (a GPU GEMM)", find_key(env, "build_config.CUDA_VERSION")};
  if (!cpu && conv) return {"cuDNN (a GPU convolution)", find_key(env, "CUDNN_VERSION")};
  if (cpu) return {"torch's own CPU kernel", find_key(env, "CPU capability")};
  return {"torch's own CUDA kernel", find_key(env, "build_config.CUDA_VERSION")};
}

std::string describe(const EnvDifference& d) {
  return fmt::format("{} differs: {} vs {}", d.key, d.a, d.b);
}

// A difference in what a CUDA kernel ran on: the GPU, its driver, the CUDA libraries (the
// fingerprint's "cuda" object), or an environment variable those libraries read. Whether CUDA
// was up when the fingerprint was written (initialized, available, built) is not one.
const EnvDifference* find_cuda_env(const std::vector<EnvDifference>& env) {
  for (const EnvDifference& d : env) {
    if (d.key.rfind("cuda.", 0) == 0 && d.key != "cuda.initialized" && d.key != "cuda.available" &&
        d.key != "cuda.built")
      return &d;
  }
  return find_env(env, {"env.CUBLAS_WORKSPACE_CONFIG", "env.NVIDIA_TF32_OVERRIDE",
                        "env.TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "env.CUDA_LAUNCH_BLOCKING"});
}

// The first CUDA device among the op's tensors ("cuda:0"), or "".
std::string cuda_device_of(const FirstDivergence& fd) {
  for (const auto* v : {&fd.evidence.inputs, &fd.evidence.outputs})
    for (const TensorPair& p : *v)
      if (p.a.present && p.a.device.rfind("cuda", 0) == 0) return p.a.device;
  return "";
}

// What computes a GPU op, where one library does: "cuBLAS (a GPU GEMM)"; "" otherwise.
std::string gpu_library_of(const FirstDivergence& fd) {
  const Implementer lib = implementer_of(fd, /*cpu=*/false, {});
  return lib.what.rfind("torch's own", 0) == 0 ? "" : lib.what;
}

// Of the CUDA differences, the one most likely to have changed this op's bits: its own GPU's
// model, then its library's version (cuBLAS for a GEMM, cuDNN for a convolution), else `first`.
const EnvDifference* gpu_suspect(const std::vector<EnvDifference>& env, const FirstDivergence& fd,
                                 const EnvDifference* first) {
  std::string device = cuda_device_of(fd);
  const size_t colon = device.find(':');
  const std::string ordinal = colon == std::string::npos ? "0" : device.substr(colon + 1);
  const std::string lib = gpu_library_of(fd);
  const std::string version = lib.rfind("cuBLAS", 0) == 0  ? "cuda.cublas_version"
                              : lib.rfind("cuDNN", 0) == 0 ? "cuda.cudnn_version"
                                                           : "";
  for (const std::string field : {"name", "compute_capability", "sm_count"})
    if (const EnvDifference* d = find_key(env, "cuda.devices." + ordinal + "." + field)) return d;
  if (!version.empty())
    if (const EnvDifference* d = find_key(env, version)) return d;
  return first;
}

// The same inputs gave other outputs: a setting that differs, else the catalog's entry.
bool explain_nondeterministic(const std::vector<EnvDifference>& env, bool on_cpu,
                              FirstDivergence* fd) {
  const EnvDifference* threads = find_env(env, {"intra_op_threads", "step.intra_op_threads",
                                                "env.OMP_NUM_THREADS", "env.MKL_NUM_THREADS"});
  const EnvDifference* det = find_env_containing(env, {"determinism."});
  const EnvDifference* cuda = on_cpu ? nullptr : find_cuda_env(env);
  if (threads && on_cpu) {
    fd->explanation.cause = describe(*threads);
    fd->explanation.remedy =
        "run every time with the same intra-op thread count "
        "(torch.set_num_threads / OMP_NUM_THREADS)";
  } else if (det) {
    fd->explanation.cause = describe(*det);
    fd->explanation.remedy = "use the same determinism settings in every run";
  } else if (cuda) {
    fd->explanation.cause = describe(*gpu_suspect(env, *fd, cuda));
    if (const std::string lib = gpu_library_of(*fd); !lib.empty())
      fd->explanation.cause += fmt::format(
          "; {} is computed by {}, whose kernels are chosen by GPU model "
          "and library version",
          fd->op, lib);
    fd->explanation.remedy =
        cuda->key.rfind("env.", 0) == 0
            ? "set the CUDA libraries' environment variables the same in every run"
            : "compare runs on the same GPU model (architecture and SM count), driver "
              "and CUDA, cuDNN, cuBLAS and NCCL versions: GPU kernels reproduce bit "
              "for bit only there";
  } else if (fd->explanation.catalog) {
    fd->explanation.cause = fmt::format("{} is a known nondeterministic op ({}): {}",
                                        fd->explanation.catalog->op, fd->explanation.catalog->id,
                                        fd->explanation.catalog->condition);
  } else {
    fd->explanation.cause =
        "the op gave different outputs for identical inputs; it is not in the catalog";
    fd->explanation.remedy =
        "enable use_deterministic_algorithms(True) and check which kernel alerts";
  }
  return true;
}

// A generator's state differed: a seed that differs, else the generator named.
bool explain_rng(const std::vector<EnvDifference>& env, bool, FirstDivergence* fd) {
  // PYTHONHASHSEED salts str hashes; it seeds no random generator.
  const EnvDifference* seed = nullptr;
  for (const EnvDifference& d : env)
    if ((d.key.find("seed") != std::string::npos || d.key.find("SEED") != std::string::npos) &&
        d.key.find("PYTHONHASHSEED") == std::string::npos) {
      seed = &d;
      break;
    }
  const std::string device = cuda_device_of(*fd);
  fd->explanation.cause =
      seed             ? describe(*seed)
      : device.empty() ? "the random generator was seeded or consumed differently before this op"
                       : fmt::format(
                             "the default CUDA generator of {} (its seed and Philox offset) "
                             "was seeded or consumed differently before this op",
                             device);
  fd->explanation.remedy =
      device.empty() ? "seed every generator at program start (torch.manual_seed, random.seed, "
                       "np.random.seed) and consume random numbers in the same order"
                     : "seed every generator at program start: torch.manual_seed(s) seeds the "
                       "CPU's and every CUDA device's (C++: at::manual_seed), and consume random "
                       "numbers in the same order";
  return true;
}

// Data entering the program differs: the data order, a Python value, a DataLoader worker.
bool explain_external(const std::vector<EnvDifference>& env, bool, FirstDivergence* fd) {
  const EnvDifference* hash = find_env(env, {"env.PYTHONHASHSEED"});
  fd->explanation.cause =
      hash ? describe(*hash)
           : "data entering the program (data loading, from_blob, numpy, another "
             "thread) differs";
  fd->explanation.remedy =
      "make the input pipeline deterministic: seed samplers, shuffles and DataLoader "
      "workers (worker_init_fn, generator=torch.Generator().manual_seed(s))";
  if (!hash && fd->evidence.data_order) {
    fd->explanation.cause =
        "the data order differs: the same samples were selected or ordered "
        "differently (a shuffle by Python's random, an unseeded sampler)";
    fd->explanation.remedy =
        "seed the order: random.seed(s) before a Python shuffle, and DataLoader("
        "generator=torch.Generator().manual_seed(s)) for its sampler";
    if (fd->evidence.hash_seed_unset) {
      fd->explanation.cause +=
          ", or a set iterated in hash order: PYTHONHASHSEED is unset in both runs";
      fd->explanation.remedy += "; iterate sorted(names), not a set, or run with PYTHONHASHSEED=0";
    }
  }
  if (!hash && fd->evidence.data_order_through_view) {
    fd->explanation.cause =
        fd->evidence.hash_seed_unset
            ? "tensors were created or picked in another order: likely Python's hash "
              "randomization, as PYTHONHASHSEED is unset in both runs and iterating a "
              "set of names (or a dict built from one) orders them anew in each process"
            : "tensors were created or picked in another order: the same values reach "
              "this op through views of different tensors";
    fd->explanation.remedy =
        "create and pick tensors in a fixed order: iterate sorted(names), not a set; "
        "or run with PYTHONHASHSEED=0. If a shuffle picks them, seed it (random.seed)";
  }
  if (!hash && !fd->evidence.scalar_argument.empty()) {
    // Where the value goes decides what it is: one that writes a parameter or the optimizer's
    // state is a hyperparameter (a learning rate), set or scheduled otherwise as often as drawn.
    const auto writes = std::find_if(
        fd->evidence.outputs.begin(), fd->evidence.outputs.end(), [](const TensorPair& t) {
          return t.differs && (t.tensor_role == TensorRole::kParameter ||
                               t.tensor_role == TensorRole::kOptimizerState);
        });
    if (writes != fd->evidence.outputs.end()) {
      fd->explanation.cause = fmt::format(
          "a hyperparameter differs ({}), passed to the op that writes the {}: a learning "
          "rate, momentum or weight decay set or scheduled otherwise in the two runs, or drawn "
          "from an unseeded generator",
          fd->evidence.scalar_argument, tensor_role_name(writes->tensor_role));
      fd->explanation.remedy =
          "give both runs the same hyperparameters: compare the optimizer's param_groups and "
          "the scheduler's state at that step, and the config or command line each run read";
    } else {
      fd->explanation.cause = fmt::format(
          "a Python value passed to the op differs ({}): drawn from an "
          "unseeded generator (random, numpy) or from the clock",
          fd->evidence.scalar_argument);
      fd->explanation.remedy =
          "seed Python's and NumPy's generators (random.seed, np.random.seed) or draw "
          "the value from a seeded torch.Generator";
    }
  }
  if (!hash && !fd->evidence.batch_read_by.empty()) {
    fd->explanation.cause =
        "data made in a DataLoader worker differs: what the Dataset drew from outside "
        "torch (NumPy, random, a file) or an unseeded worker";
    fd->explanation.remedy =
        "seed what __getitem__ draws from in each worker: worker_init_fn seeding "
        "numpy and random from torch.initial_seed(), and no generator created "
        "unseeded in the Dataset (np.random.default_rng(seed))";
  }
  return true;
}

// Another process wrote the bytes through shared memory.
bool explain_shared_memory(const std::vector<EnvDifference>&, bool, FirstDivergence* fd) {
  fd->explanation.cause =
      "another process wrote these bytes through shared memory (share_memory_(), "
      "Hogwild training): whose update lands first, and what each process reads, "
      "follows timing";
  if (!fd->evidence.shared_writer.empty())
    fd->explanation.cause += "; written by " + fd->evidence.shared_writer;
  fd->explanation.remedy =
      "for a reproducible run, do not share parameters between training processes "
      "(one copy each, averaged in a fixed order), or serialise the writers: a "
      "torch.multiprocessing Lock around each optimizer step, taken in a fixed order";
  return true;
}

// Another rank sent the difference, and its origin was not recorded.
bool explain_remote_input(const std::vector<EnvDifference>&, bool, FirstDivergence* fd) {
  fd->explanation.cause =
      "another rank sent different data into this collective, and no stream of that "
      "rank recorded where it diverged";
  fd->explanation.remedy =
      "record every rank (--ranks all) so the diff can follow the collective to the "
      "rank where the difference began";
  return true;
}

// Memory of the empty family was read; FSDP's unwritten shards named as such.
bool explain_uninitialized(const std::vector<EnvDifference>&, bool, FirstDivergence* fd) {
  fd->explanation.cause = "an op read memory returned by the empty family (uninitialized)";
  fd->explanation.remedy =
      "initialise the buffer (torch.zeros) or enable deterministic mode with "
      "fill_uninitialized_memory=True";
  // FSDP2 gathers sharded parameters: garbage there is a parameter no initialiser wrote.
  const bool fsdp_parameter = fd->scope_path.find("FSDP::") != std::string::npos ||
                              (!fd->chain.empty() && fd->chain.front().rfind("fsdp::", 0) == 0);
  if (fsdp_parameter) {
    fd->explanation.cause =
        "FSDP gathered a parameter shard that no op wrote: memory from the empty "
        "family, as module.to_empty() leaves every parameter until something "
        "initialises it";
    fd->explanation.remedy =
        "after model.to_empty(), initialise every parameter: reset_parameters() "
        "must reach each submodule (or load a checkpoint); "
        "torch.use_deterministic_algorithms(True) only fills the garbage with NaN";
  }
  return true;
}

// Different ops ran: a thread count inside kernels (final: no catalog remedy added), a torch
// build, or control flow.
bool explain_structural(const std::vector<EnvDifference>& env, bool, FirstDivergence* fd) {
  const EnvDifference* ver = find_torch_build(env);
  const EnvDifference* threads = find_env(env, {"intra_op_threads", "step.intra_op_threads",
                                                "env.OMP_NUM_THREADS", "env.MKL_NUM_THREADS"});
  if (fd->evidence.nested && threads && !ver) {
    // Same ops at every level both runs share; only kernels' internal ops differ, as a
    // parallel reduction's per-thread buffers do with another thread count.
    fd->explanation.cause = describe(*threads);
    fd->explanation.remedy =
        "run every time with the same intra-op thread count "
        "(torch.set_num_threads / OMP_NUM_THREADS): parallel kernels split their "
        "work, and allocate and combine partial results, by thread count";
    return false;
  }
  if (fd->evidence.same_values && !ver) {
    fd->explanation.cause =
        "the runs ran other ops for the same values (a refactor, or another decomposition): "
        "every value the replaced ops hand on, and every op compared after them, is equal bit "
        "for bit";
    fd->explanation.remedy =
        "nothing to fix if the change was meant; `detaudit diff --fail-on tolerance` passes "
        "such regions and fails where values moved";
    return true;
  }
  fd->explanation.cause =
      ver ? describe(*ver)
          : "the runs executed different ops, shapes or arguments (control flow or "
            "configuration differs)";
  fd->explanation.remedy =
      "make control flow independent of unseeded state; compare runs of the same "
      "program, configuration and PyTorch build";
  return true;
}

// An input made outside the aligned ops differs.
bool explain_input_differs(const std::vector<EnvDifference>&, bool, FirstDivergence* fd) {
  fd->explanation.cause =
      "an input produced outside the aligned ops differs (an earlier divergence in "
      "another stream, or an unrecorded write)";
  fd->explanation.remedy =
      "look at the other streams' divergences and at in-place writes by unrecorded ops";
  return true;
}

// Another torch build gave other bits for the same inputs: which build, and which library
// computes the op, are the answer; the kernel need not be nondeterministic.
bool explain_torch_build(const std::vector<EnvDifference>& env, bool on_cpu, FirstDivergence* fd) {
  const EnvDifference* build = find_torch_build(env);
  const Implementer lib = implementer_of(*fd, on_cpu, env);
  const std::string builds = build->key == "torch_version"
                                 ? fmt::format("torch {} in run A, {} in run B", build->a, build->b)
                                 : fmt::format("two builds of one torch version (commit {} vs {})",
                                               build->a, build->b);
  fd->explanation.cause = fmt::format("the torch build differs ({}); {} is computed by {}", builds,
                                      fd->op, lib.what);
  if (lib.version)
    fd->explanation.cause += fmt::format(", {} in run A and {} in run B", lib.version->a,
                                         lib.version->b);
  else
    fd->explanation.cause += ", whose code can change between builds";
  fd->explanation.remedy =
      "to test reproducibility, compare runs of one torch build; across builds, bits are not "
      "expected to match: gate on a tolerance (--fail-on tolerance with --ulp N or --rtol) and "
      "read where the numerics first leave it";
  return false;
}

// Each class's explanation; false when its remedy is final (no catalog remedy added).
using ExplainFn = bool (*)(const std::vector<EnvDifference>& env, bool on_cpu, FirstDivergence* fd);
struct ClassExplanation {
  DivergenceClass divergence_class;
  ExplainFn explain;
};
constexpr ClassExplanation kExplanations[] = {
    {DivergenceClass::kNondeterministicOp, explain_nondeterministic},
    {DivergenceClass::kRngState, explain_rng},
    {DivergenceClass::kExternalInput, explain_external},
    {DivergenceClass::kSharedMemory, explain_shared_memory},
    {DivergenceClass::kRemoteInput, explain_remote_input},
    {DivergenceClass::kUninitializedMemory, explain_uninitialized},
    {DivergenceClass::kStructural, explain_structural},
    {DivergenceClass::kTorchBuild, explain_torch_build},
};

}  // namespace

bool torch_builds_differ(const std::vector<EnvDifference>& env) {
  return find_torch_build(env) != nullptr;
}

void explain_cause(const std::vector<EnvDifference>& env, FirstDivergence* fd) {
  if (fd->evidence.arose_in_compiled_region) {
    fd->explanation.cause = fmt::format(
        "a kernel inside the torch.compile region {} (inductor-generated, not "
        "recorded) gave different results for the same inputs",
        fd->evidence.compiled_region);
    fd->explanation.remedy =
        "torch.use_deterministic_algorithms(True) before compiling; to name the op, "
        "audit again without compilation: --env TORCHDYNAMO_DISABLE=1";
    return;
  }
  ExplainFn explain = explain_input_differs;  // input-differs, and any class not listed
  for (const ClassExplanation& e : kExplanations)
    if (fd->divergence_class == e.divergence_class) explain = e.explain;
  if (!explain(env, on_cpu(*fd), fd)) return;
  if (fd->explanation.catalog && fd->explanation.remedy.empty())
    fd->explanation.remedy = fd->explanation.catalog->remedy;
  if (fd->explanation.catalog && fd->divergence_class == DivergenceClass::kNondeterministicOp &&
      fd->explanation.remedy != fd->explanation.catalog->remedy)
    fd->explanation.remedy += "; catalog: " + fd->explanation.catalog->remedy;
}

}  // namespace detaudit
