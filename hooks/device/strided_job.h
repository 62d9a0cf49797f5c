// Whether a view can be digested in place, through its strides, and its JobGeometry: its
// dimensions merged (at most kMaxJobDims), elements of 1, 2, 4 or 8 bytes aligned to their size.
// The recorder's choice (hooks/tensors/device_digests.cpp) and the GPU check's
// (tests/gpu/device_digest_check.cpp) are this one. Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>

#include "device/lane_kernel.h"
#include "digest/strided.h"

namespace detaudit::device {

inline bool strided_geometry(const void* data, size_t elem_size, const int64_t* sizes,
                             const int64_t* strides, size_t dims, JobGeometry* g) {
  if ((elem_size != 1 && elem_size != 2 && elem_size != 4 && elem_size != 8) ||
      reinterpret_cast<uintptr_t>(data) % elem_size != 0)
    return false;
  trace::Dims merged_sizes, merged_strides;
  if (!normalize_view(sizes, strides, dims, &merged_sizes, &merged_strides) ||
      merged_sizes.size() > size_t(kMaxJobDims))
    return false;
  g->dims = uint8_t(merged_sizes.size());
  g->elem_size = uint8_t(elem_size);
  for (size_t d = 0; d < merged_sizes.size(); ++d) {
    g->sizes[d] = merged_sizes[d];
    g->strides[d] = merged_strides[d];
  }
  return true;
}

}  // namespace detaudit::device
