#include "digest/strided.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace detaudit {

namespace {

// Copies n elements `stride` elements apart into out, with loads of the element's own width.
template <typename T>
void gather(const char* src, int64_t stride, size_t n, char* out) {
  for (size_t i = 0; i < n; ++i) std::memcpy(out + i * sizeof(T), src + int64_t(i) * stride * int64_t(sizeof(T)), sizeof(T));
}

void gather_elements(const char* src, int64_t stride, size_t n, size_t esize, char* out) {
  switch (esize) {
    case 1: return gather<uint8_t>(src, stride, n, out);
    case 2: return gather<uint16_t>(src, stride, n, out);
    case 4: return gather<uint32_t>(src, stride, n, out);
    case 8: return gather<uint64_t>(src, stride, n, out);
    default:
      for (size_t i = 0; i < n; ++i)
        std::memcpy(out + i * esize, src + int64_t(i) * stride * int64_t(esize), esize);
  }
}

// Feeds the elements of a non-contiguous tensor in logical order, gathered into a staging buffer
// so the hash sees large updates.
}  // namespace

void feed_strided(const void* data, size_t esize, const int64_t* view_sizes,
                  const int64_t* view_strides, size_t dims, TensorDigester* digester) {
  const auto* base = static_cast<const char*>(data);
  // Drop size-1 dimensions and merge dimensions that are contiguous with each other.
  trace::Dims sizes, strides;  // inline: small tensors are the common case here
  sizes.resize(dims);
  strides.resize(dims);
  size_t ndim = 0;
  for (size_t d = 0; d < dims; ++d) {
    if (view_sizes[d] == 0) return;
    if (view_sizes[d] == 1) continue;
    if (ndim > 0 && strides[ndim - 1] == view_strides[d] * view_sizes[d]) {
      sizes[ndim - 1] *= view_sizes[d];
      strides[ndim - 1] = view_strides[d];
      continue;
    }
    sizes[ndim] = view_sizes[d];
    strides[ndim] = view_strides[d];
    ++ndim;
  }
  sizes.resize(ndim);
  strides.resize(ndim);
  if (sizes.empty()) {
    digester->update(base, esize);
    return;
  }
  const size_t inner = size_t(sizes[ndim - 1]);
  const int64_t inner_stride = strides[ndim - 1];
  const int outer_dims = int(ndim) - 1;
  trace::Dims index;
  index.resize(size_t(outer_dims));
  std::fill(index.begin(), index.end(), 0);
  thread_local std::vector<char> staging(256 * 1024);
  const size_t capacity = staging.size() / esize;  // elements
  size_t used = 0;  // elements
  auto flush = [&] {
    digester->update(staging.data(), used * esize);
    used = 0;
  };
  for (;;) {
    int64_t offset = 0;
    for (int d = 0; d < outer_dims; ++d) offset += index[size_t(d)] * strides[size_t(d)];
    const char* row = base + offset * int64_t(esize);
    if (inner_stride == 1 && inner >= capacity) {
      flush();
      digester->update(row, inner * esize);
    } else {
      for (size_t done = 0; done < inner;) {
        if (used == capacity) flush();
        const size_t n = std::min(inner - done, capacity - used);
        gather_elements(row + int64_t(done) * inner_stride * int64_t(esize), inner_stride, n, esize,
                        staging.data() + used * esize);
        used += n;
        done += n;
      }
    }
    int d = outer_dims - 1;
    for (; d >= 0; --d) {
      if (++index[size_t(d)] < sizes[size_t(d)]) break;
      index[size_t(d)] = 0;
    }
    if (d < 0) break;
  }
  flush();
}

}  // namespace detaudit
