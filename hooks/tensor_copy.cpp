#include "tensor_copy.h"

namespace detaudit::hooks {

at::Tensor copy_with_layout(const at::Tensor& tensor, bool* compacted) {
  const at::Tensor t = tensor.detach();
  if (compacted) *compacted = false;
  const bool whole_storage = t.is_contiguous() && t.storage_offset() == 0 &&
                             t.storage().nbytes() == size_t(t.numel()) * t.element_size();
  if (!t.has_storage() || whole_storage) return t.clone(at::MemoryFormat::Preserve);
  const size_t nbytes = t.storage().nbytes();
  if (nbytes > kMaxLayoutCopyBytes) {
    if (compacted) *compacted = true;
    return t.clone(at::MemoryFormat::Preserve);
  }
  const auto bytes_of = [nbytes](const c10::Storage& s, const at::TensorOptions& o) {
    return at::empty({0}, o.dtype(at::kByte)).set_(s, 0, {int64_t(nbytes)}, {1});
  };
  at::Tensor dst_bytes = at::empty({int64_t(nbytes)}, t.options().dtype(at::kByte));
  dst_bytes.copy_(bytes_of(t.storage(), t.options()));
  return at::empty({0}, t.options()).set_(dst_bytes.storage(), t.storage_offset(), t.sizes(), t.strides());
}

}  // namespace detaudit::hooks
