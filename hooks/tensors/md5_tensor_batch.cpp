#include "tensors/md5_tensor_batch.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "digest/strided.h"
#include "tensors/tensor_digest.h"
#include "trace/format.h"

namespace detaudit::hooks {

namespace {
// From here a copy is cut across the intra-op threads: below, waking them costs more than it saves.
constexpr size_t kSharedCopyBytes = 256 * 1024;
}  // namespace

Md5TensorBatch::Md5TensorBatch(bool on_intra_op_threads)
    : on_intra_op_threads_(on_intra_op_threads),
      slots_(on_intra_op_threads ? IntraOpThreads{on_torch_pool, torch_pool_threads}
                                 : IntraOpThreads{}) {}

bool Md5TensorBatch::takes(const at::Tensor& t) {
  const size_t bytes = t.nbytes();
  return bytes > 0 && bytes <= Md5Batch::kMaxTensorBytes && t.is_cpu() && !t.is_conj() &&
         !t.is_neg() && (t.is_contiguous() || size_t(t.dim()) <= trace::Dims::kInline);
}

std::shared_ptr<PendingDigest> Md5TensorBatch::add(const at::Tensor& t, bool with_stats) {
  const size_t bytes = t.nbytes();
  uint8_t* out = slots_.reserve(bytes);
  const auto* in = static_cast<const uint8_t*>(t.data_ptr());
  const size_t esize = size_t(t.element_size());
  const bool contiguous = t.is_contiguous();
  // A large copy is cut across the intra-op threads, which would spin meanwhile: a view by rows
  // of its first dimension, so that each piece is a view of its own.
  size_t threads = on_intra_op_threads_ && bytes >= kSharedCopyBytes ? torch_pool_threads() : 1;
  if (!contiguous) threads = std::min(threads, t.dim() > 0 ? size_t(t.size(0)) : size_t(1));
  bool copied = true;
  if (contiguous && threads < 2) {
    std::memcpy(out, in, bytes);
  } else if (contiguous) {
    const size_t piece = (bytes / threads + 63) / 64 * 64;  // cache lines apart
    on_torch_pool(threads, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        const size_t from = std::min(bytes, i * piece), to = std::min(bytes, from + piece);
        std::memcpy(out + from, in + from, to - from);
      }
    });
  } else if (threads < 2) {
    copied = gather_view(in, esize, t.sizes().data(), t.strides().data(), size_t(t.dim()), out,
                         bytes);
  } else {
    const int64_t rows = t.size(0), row_bytes = int64_t(bytes) / rows;
    std::atomic<bool> all{true};
    on_torch_pool(threads, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        const int64_t first = rows * int64_t(i) / int64_t(threads);
        const int64_t last = rows * int64_t(i + 1) / int64_t(threads);
        trace::Dims sizes;
        sizes.assign(t.sizes().begin(), t.sizes().end());
        sizes[0] = last - first;
        if (!gather_view(in + first * t.stride(0) * int64_t(esize), esize, sizes.data(),
                         t.strides().data(), size_t(t.dim()), out + first * row_bytes,
                         size_t((last - first) * row_bytes)))
          all.store(false, std::memory_order_relaxed);
      }
    });
    copied = all.load(std::memory_order_relaxed);
  }
  if (!copied) return nullptr;  // an element size the gather does not handle: nothing committed
  return slots_.commit(dtype_of(t), with_stats);
}

}  // namespace detaudit::hooks
