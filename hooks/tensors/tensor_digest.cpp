#include "tensors/tensor_digest.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>

#include "digest/strided.h"

namespace detaudit::hooks {

bool has_no_data(const at::Tensor& t) {
  // Symbolic sizes: a tensor of torch.compile's tracing with dynamic shapes, whose numel()
  // throws (and an error's message costs a symbolized backtrace: most of a recorded compile).
  if (t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) return true;
  // A meta tensor has no bytes either, but it is the program's own: it runs in every run.
  return !t.is_meta() && t.has_storage() && t.numel() > 0 &&
         t.storage().data_ptr().get() == nullptr;
}

const char* unhashable_reason(const at::Tensor& t) {
  if (t.is_sparse() || t.layout() != at::kStrided) return "sparse or non-strided layout";
  if (t.is_quantized()) return "quantized";
  if (t.is_meta()) return "meta tensor (no data)";
  if (t.is_nested()) return "nested tensor";
  if (t.is_mkldnn()) return "mkldnn tensor";
  if (!t.has_storage()) return "no storage";
  if (has_no_data(t)) return kNoDataReason;
  if (trace::dtype_size(dtype_of(t)) == 0) return "unsupported dtype";
  return nullptr;
}

namespace {

// The leaves of a large tensor go to torch's own intra-op threads: they are idle while the op's
// thread records, and their number is the one the program chose.
std::atomic<uint64_t> g_pool_tensors{0}, g_pool_units{0}, g_units_elsewhere{0};

void leaves_on_torch_pool(size_t n, const std::function<void(size_t, size_t)>& fn) {
  const std::thread::id caller = std::this_thread::get_id();
  g_pool_tensors.fetch_add(1, std::memory_order_relaxed);
  g_pool_units.fetch_add(n, std::memory_order_relaxed);
  on_torch_pool(n, [&](size_t begin, size_t end) {
    if (std::this_thread::get_id() != caller)
      g_units_elsewhere.fetch_add(uint64_t(end - begin), std::memory_order_relaxed);
    fn(begin, end);
  });
}

}  // namespace

void on_torch_pool(size_t n, const std::function<void(size_t, size_t)>& fn) {
  at::parallel_for(0, int64_t(n), 1,
                   [&](int64_t begin, int64_t end) { fn(size_t(begin), size_t(end)); });
}

namespace {
// In a forked child libgomp's team is still the parent's: a parallel region there can wait for
// threads the fork left behind, where the program itself may never open one.
const pid_t g_loaded_in = ::getpid();
}  // namespace

size_t torch_pool_threads() {
  if (at::in_parallel_region() || ::getpid() != g_loaded_in) return 1;
  return size_t(std::max(1, at::get_num_threads()));
}

void forget_torch_pool_status() {
  for (auto* counter : {&g_pool_tensors, &g_pool_units, &g_units_elsewhere})
    counter->store(0, std::memory_order_relaxed);
}

std::string torch_pool_status() {
  const uint64_t tensors = g_pool_tensors.load(std::memory_order_relaxed);
  if (tensors == 0) return "";
  return "large tensors: " + std::to_string(tensors) + ", " +
         std::to_string(g_units_elsewhere.load(std::memory_order_relaxed)) + " of " +
         std::to_string(g_pool_units.load(std::memory_order_relaxed)) +
         " units hashed on torch's other threads";
}

void describe_geometry(const at::Tensor& t, size_t digest_len, trace::TensorDesc* desc) {
  desc->dtype = dtype_of(t);
  desc->device_type = uint8_t(t.device().type());
  desc->device_index = t.device().index();
  desc->sizes.assign(t.sizes().begin(), t.sizes().end());
  const bool contiguous = t.is_contiguous();
  desc->bits = contiguous ? trace::kTensorContiguous : 0;
  if (contiguous)
    desc->strides.clear();
  else
    desc->strides.assign(t.strides().begin(), t.strides().end());
  desc->digest.fill(0);
  desc->digest_len = uint8_t(digest_len);
  desc->stats = trace::TensorStats{};
}

uint64_t describe_tensor(const at::Tensor& tensor, Hasher* hasher, bool with_stats,
                         trace::TensorDesc* desc) {
  describe_geometry(tensor, hasher->length(), desc);

  // The slow, synchronising path for device tensors; the CPU path never copies. The copies are
  // ours, not the program's: no RecordFunction callback (a profiler's) should see them, and no
  // autograd node should take a sequence number from the program's. The guard costs a rebuild of
  // libtorch's thread-local callback list, so only this path pays for it.
  at::Tensor t = tensor;
  if (!t.device().is_cpu() || t.is_conj() || t.is_neg()) {
    at::RecordFunctionGuard no_recording(false);
    c10::AutoGradMode no_autograd(false);
    if (!t.device().is_cpu()) t = t.to(at::kCPU);
    if (t.is_conj()) t = t.resolve_conj();
    if (t.is_neg()) t = t.resolve_neg();
  }

  TensorDigester digester(hasher, desc->dtype, with_stats);
  if (t.numel() > 0) {
    if (t.is_contiguous()) {
      const size_t nbytes = size_t(t.numel()) * size_t(t.element_size());
      // Only a tensor of several leaves asks torch for its threads (a thread-local read).
      digester.update_all(t.data_ptr(), nbytes, leaves_on_torch_pool,
                          nbytes > kLeafBytes ? torch_pool_threads() : 1);
    } else {
      feed_strided(t.data_ptr(), size_t(t.element_size()), t.sizes().data(), t.strides().data(),
                   size_t(t.dim()), &digester);
    }
  }
  digester.finish(desc);
  return digester.bytes();
}

uint64_t generator_digest(const at::Generator& gen) {
  at::RecordFunctionGuard no_recording(false);
  at::Tensor state = gen.get_state();
  return XXH3_64bits(state.data_ptr(), size_t(state.numel()) * size_t(state.element_size()));
}

}  // namespace detaudit::hooks
