// A copy of a tensor that keeps how it lies in memory: its storage's bytes, offset, sizes and
// strides. A kernel may pick its path by layout (a slice, an expanded input with stride 0), so a
// capture and each replay hand the op what it received, not a compact clone.
#pragma once

#include <ATen/ATen.h>

namespace detaudit::hooks {

// Storages up to this size are copied whole; a view into a larger one (a flat parameter
// buffer) is copied compact instead.
inline constexpr size_t kMaxLayoutCopyBytes = size_t(1) << 30;

// A detached copy of t on t's device with t's storage offset, sizes and strides; compact (as
// clone(Preserve)) when its storage is over kMaxLayoutCopyBytes, which *compacted then says.
at::Tensor copy_with_layout(const at::Tensor& t, bool* compacted = nullptr);

}  // namespace detaudit::hooks
