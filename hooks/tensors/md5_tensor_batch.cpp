#include "tensors/md5_tensor_batch.h"

#include <cstring>

#include "digest/strided.h"
#include "tensors/tensor_digest.h"
#include "trace/format.h"

namespace detaudit::hooks {

Md5TensorBatch::Md5TensorBatch(bool on_intra_op_threads)
    : slots_(on_intra_op_threads ? IntraOpThreads{on_torch_pool, torch_pool_threads}
                                 : IntraOpThreads{}) {}

bool Md5TensorBatch::takes(const at::Tensor& t) {
  const size_t bytes = t.nbytes();
  return bytes > 0 && bytes <= Md5Batch::kMaxTensorBytes && t.is_cpu() && !t.is_conj() &&
         !t.is_neg() && (t.is_contiguous() || size_t(t.dim()) <= trace::Dims::kInline);
}

std::shared_ptr<PendingDigest> Md5TensorBatch::add(const at::Tensor& t, bool with_stats) {
  const size_t bytes = t.nbytes();
  uint8_t* out = slots_.reserve(bytes);
  if (t.is_contiguous()) {
    std::memcpy(out, t.data_ptr(), bytes);
  } else if (!gather_view(t.data_ptr(), size_t(t.element_size()), t.sizes().data(),
                          t.strides().data(), size_t(t.dim()), out, bytes)) {
    return nullptr;  // an element size the gather does not handle: nothing was committed
  }
  return slots_.commit(dtype_of(t), with_stats);
}

}  // namespace detaudit::hooks
