// A strided view's elements fed to a digester in logical (row-major) order: the order that makes
// a digest independent of layout. Torch-free, so views are tested without libtorch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "digest/tensor_digester.h"
#include "trace/dims.h"

namespace detaudit {

// data points at the view's first element (its offset applied); strides are in elements and may
// be zero (expanded) or negative. Gathers into a staging buffer so the hash sees large updates.
void feed_strided(const void* data, size_t elem_size, const int64_t* sizes, const int64_t* strides,
                  size_t dims, TensorDigester* digester);

// The view's dimensions with size-1 ones dropped and those contiguous with each other merged (a
// transpose stays 2-D, channels_last 3-D). False for a view with no element.
bool normalize_view(const int64_t* view_sizes, const int64_t* view_strides, size_t dims,
                    trace::Dims* sizes, trace::Dims* strides);

// The same elements copied into out, in logical order, when they fit its capacity (bytes) and
// the element size is one the gather handles (1, 2, 4, 8 or 16 bytes); false otherwise, out
// then unspecified. A view with no element copies nothing.
bool gather_view(const void* data, size_t elem_size, const int64_t* sizes, const int64_t* strides,
                 size_t dims, void* out, size_t capacity);

}  // namespace detaudit
