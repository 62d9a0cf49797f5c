#include "digest/strided.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "digest/avx2_transpose.h"

namespace detaudit {

namespace {

// Copies n elements `stride` elements apart into out, with loads of the element's own width.
template <typename T>
void gather(const char* src, int64_t stride, size_t n, char* out) {
  for (size_t i = 0; i < n; ++i)
    std::memcpy(out + i * sizeof(T), src + int64_t(i) * stride * int64_t(sizeof(T)), sizeof(T));
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

// Copies every element into out in logical (row-major) order. The inner loop runs along the
// dimension of smallest nonzero stride, so the reads follow memory and the per-row overhead is
// spread over the longest run (a transposed [64, 4] walks 4 runs of 64, not 64 runs of 4).
template <typename T>
void gather_all(const char* base, const int64_t* sizes, const int64_t* strides, size_t ndim,
                char* out) {
  int64_t out_strides[trace::Dims::kInline];
  out_strides[ndim - 1] = 1;
  for (size_t d = ndim - 1; d > 0; --d) out_strides[d - 1] = out_strides[d] * sizes[d];
  // A broadcast dimension (stride 0) is never the inner one while another is not: it reads one
  // element and scatters it (an expanded bias would be copied element by element, not row by row).
  auto reach = [&](size_t d) {
    const int64_t a = strides[d] < 0 ? -strides[d] : strides[d];
    return a == 0 ? INT64_MAX : a;
  };
  size_t inner = 0;
  for (size_t d = 1; d < ndim; ++d) {
    if (reach(d) < reach(inner) || (reach(d) == reach(inner) && sizes[d] > sizes[inner])) inner = d;
  }
  const int64_t n = sizes[inner], src_step = strides[inner], dst_step = out_strides[inner];
  int64_t index[trace::Dims::kInline] = {};
  const T* src = reinterpret_cast<const T*>(base);
  T* dst = reinterpret_cast<T*>(out);
  int64_t src_off = 0, dst_off = 0;
  for (;;) {
    const T* s = src + src_off;
    T* o = dst + dst_off;
    // Rows that are runs in both (a head split's [b, h, s, d] of [b, s, h, d]) copy as bytes.
    if (src_step == 1 && dst_step == 1)
      std::memcpy(o, s, size_t(n) * sizeof(T));
    else
      for (int64_t i = 0; i < n; ++i) o[i * dst_step] = s[i * src_step];
    size_t d = ndim;
    for (; d > 0; --d) {
      const size_t k = d - 1;
      if (k == inner) continue;
      src_off += strides[k];
      dst_off += out_strides[k];
      if (++index[k] < sizes[k]) break;
      src_off -= strides[k] * sizes[k];
      dst_off -= out_strides[k] * sizes[k];
      index[k] = 0;
    }
    if (d == 0) return;
  }
}

#if defined(__x86_64__)
// One [rows, cols] plane of 4-byte elements whose rows lie next to each other in memory (row
// stride 1, column stride col_stride > 0): the transpose of a contiguous matrix, as a weight's
// .t() or its gradient. Copied in 8x8 tiles through AVX2 registers, loads along memory and
// stores along the output's rows, where the element loop writes one element per column.
__attribute__((target("avx2"))) void transpose_plane_avx2(const uint32_t* src, int64_t rows,
                                                          int64_t cols, int64_t col_stride,
                                                          uint32_t* out) {
  int64_t c = 0;
  for (; c + 8 <= cols; c += 8) {
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8) {
      __m256i v[8];
      for (int k = 0; k < 8; ++k)
        v[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + (c + k) * col_stride + r));
      transpose8x8_epi32(v);  // v[j]: row r + j, columns c .. c + 7
      for (int j = 0; j < 8; ++j)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (r + j) * cols + c), v[j]);
    }
    for (; r < rows; ++r)
      for (int k = 0; k < 8; ++k) out[r * cols + c + k] = src[(c + k) * col_stride + r];
  }
  for (; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) out[r * cols + c] = src[c * col_stride + r];
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

// The tiles, where the view's last two dimensions are such a plane: each plane of the leading
// dimensions in turn.
bool gather_transposed_planes(const char* base, const int64_t* sizes, const int64_t* strides,
                              size_t ndim, char* out) {
  if (ndim < 2 || ndim > trace::Dims::kInline || strides[ndim - 2] != 1 || strides[ndim - 1] <= 0 ||
      sizes[ndim - 2] < 8 || sizes[ndim - 1] < 8 || !has_avx2())
    return false;
  const int64_t rows = sizes[ndim - 2], cols = sizes[ndim - 1], plane = rows * cols;
  int64_t index[trace::Dims::kInline] = {};
  const auto* src = reinterpret_cast<const uint32_t*>(base);
  auto* dst = reinterpret_cast<uint32_t*>(out);
  for (int64_t src_off = 0;;) {
    transpose_plane_avx2(src + src_off, rows, cols, strides[ndim - 1], dst);
    dst += plane;
    size_t d = ndim - 2;
    for (; d > 0; --d) {
      src_off += strides[d - 1];
      if (++index[d - 1] < sizes[d - 1]) break;
      src_off -= strides[d - 1] * sizes[d - 1];
      index[d - 1] = 0;
    }
    if (d == 0) return true;
  }
}
#else
bool gather_transposed_planes(const char*, const int64_t*, const int64_t*, size_t, char*) {
  return false;
}
#endif

struct Bytes16 {
  uint8_t b[16];
};

bool gather_all_elements(const char* base, size_t esize, const int64_t* sizes,
                         const int64_t* strides, size_t ndim, char* out) {
  switch (esize) {
    case 1: gather_all<uint8_t>(base, sizes, strides, ndim, out); return true;
    case 2: gather_all<uint16_t>(base, sizes, strides, ndim, out); return true;
    case 4:
      if (!gather_transposed_planes(base, sizes, strides, ndim, out))
        gather_all<uint32_t>(base, sizes, strides, ndim, out);
      return true;
    case 8: gather_all<uint64_t>(base, sizes, strides, ndim, out); return true;
    case 16: gather_all<Bytes16>(base, sizes, strides, ndim, out); return true;
    default: return false;
  }
}

void serially(size_t n, const std::function<void(size_t, size_t)>& fn) { fn(0, n); }

// A normalized view of `total` bytes gathered whole into out, if its layout is one we gather.
bool gather_whole(const char* base, size_t esize, const trace::Dims& sizes,
                  const trace::Dims& strides, char* out) {
  if (sizes.empty()) {
    std::memcpy(out, base, esize);
    return true;
  }
  return sizes.size() <= trace::Dims::kInline &&
         gather_all_elements(base, esize, sizes.data(), strides.data(), sizes.size(), out);
}

size_t view_bytes(size_t esize, const trace::Dims& sizes) {
  size_t total = esize;
  for (int64_t s : sizes) total *= size_t(s);
  return total;
}

}  // namespace

bool normalize_view(const int64_t* view_sizes, const int64_t* view_strides, size_t dims,
                    trace::Dims* sizes, trace::Dims* strides) {
  sizes->resize(dims);
  strides->resize(dims);
  size_t ndim = 0;
  for (size_t d = 0; d < dims; ++d) {
    if (view_sizes[d] == 0) return false;
    if (view_sizes[d] == 1) continue;
    if (ndim > 0 && (*strides)[ndim - 1] == view_strides[d] * view_sizes[d]) {
      (*sizes)[ndim - 1] *= view_sizes[d];
      (*strides)[ndim - 1] = view_strides[d];
      continue;
    }
    (*sizes)[ndim] = view_sizes[d];
    (*strides)[ndim] = view_strides[d];
    ++ndim;
  }
  sizes->resize(ndim);
  strides->resize(ndim);
  return true;
}

bool gather_view(const void* data, size_t esize, const int64_t* view_sizes,
                 const int64_t* view_strides, size_t dims, void* out, size_t capacity) {
  trace::Dims sizes, strides;
  if (!normalize_view(view_sizes, view_strides, dims, &sizes, &strides)) return true;
  return view_bytes(esize, sizes) <= capacity &&
         gather_whole(static_cast<const char*>(data), esize, sizes, strides,
                      static_cast<char*>(out));
}

// Feeds the elements of a non-contiguous tensor in logical order, gathered into a staging buffer
// so the hash sees large updates.
void feed_strided(const void* data, size_t esize, const int64_t* view_sizes,
                  const int64_t* view_strides, size_t dims, TensorDigester* digester) {
  const auto* base = static_cast<const char*>(data);
  trace::Dims sizes, strides;  // inline: small tensors are the common case here
  if (!normalize_view(view_sizes, view_strides, dims, &sizes, &strides)) return;
  const size_t ndim = sizes.size();
  thread_local std::vector<char> staging(256 * 1024);
  // A view of up to kWholeBytes is gathered whole and digested in one call: its leaves then go
  // through MD5's vector lanes, where a stream of updates hashes each leaf alone (a transposed
  // weight or activation, 4x slower). The buffer grows to the largest such view and stays.
  constexpr size_t kWholeBytes = size_t(16) << 20;
  const size_t total = view_bytes(esize, sizes);
  if (total <= kWholeBytes && total > staging.size()) staging.resize(total);
  if (total <= staging.size() && gather_whole(base, esize, sizes, strides, staging.data())) {
    digester->update_all(staging.data(), total, serially);
    return;
  }
  const size_t inner = size_t(sizes[ndim - 1]);
  const int64_t inner_stride = strides[ndim - 1];
  const int outer_dims = int(ndim) - 1;
  trace::Dims index;
  index.resize(size_t(outer_dims));
  std::fill(index.begin(), index.end(), 0);
  const size_t capacity = staging.size() / esize;  // elements
  size_t used = 0;                                 // elements
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
