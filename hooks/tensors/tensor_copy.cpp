#include "tensors/tensor_copy.h"

namespace detaudit::hooks {

at::Tensor copy_with_layout(const at::Tensor& tensor, bool* compacted) {
  const at::Tensor t = tensor.detach();
  if (compacted) *compacted = false;
  if (!t.has_storage()) return t.clone(at::MemoryFormat::Preserve);
  const size_t nbytes = t.storage().nbytes();
  const bool whole_storage = t.is_contiguous() && t.storage_offset() == 0 &&
                             nbytes == size_t(t.numel()) * t.element_size();
  if (whole_storage || nbytes > kMaxLayoutCopyBytes) {
    if (compacted) *compacted = !whole_storage;
    return t.clone(at::MemoryFormat::Preserve);
  }
  // The storage's bytes, copied as bytes, then the same view over the copy.
  const at::TensorOptions bytes = t.options().dtype(at::kByte);
  at::Tensor dst_bytes = at::empty({int64_t(nbytes)}, bytes);
  dst_bytes.copy_(at::empty({0}, bytes).set_(t.storage(), 0, {int64_t(nbytes)}, {1}));
  return at::empty({0}, t.options())
      .set_(dst_bytes.storage(), t.storage_offset(), t.sizes(), t.strides());
}

}  // namespace detaudit::hooks
