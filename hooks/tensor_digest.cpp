#include "tensor_digest.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <xxhash.h>

#include <cstring>

namespace detaudit::hooks {

bool has_no_data(const at::Tensor& t) {
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
  if (trace::dtype_size(uint8_t(t.scalar_type())) == 0) return "unsupported dtype";
  return nullptr;
}

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
void feed_strided(const at::Tensor& t, TensorDigester* digester) {
  const size_t esize = size_t(t.element_size());
  const auto* base = static_cast<const char*>(t.data_ptr());
  // Drop size-1 dimensions and merge dimensions that are contiguous with each other.
  trace::Dims sizes, strides;  // inline: small tensors are the common case here
  sizes.resize(size_t(t.dim()));
  strides.resize(size_t(t.dim()));
  size_t ndim = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 1) continue;
    if (ndim > 0 && strides[ndim - 1] == t.stride(d) * t.size(d)) {
      sizes[ndim - 1] *= t.size(d);
      strides[ndim - 1] = t.stride(d);
      continue;
    }
    sizes[ndim] = t.size(d);
    strides[ndim] = t.stride(d);
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

// The leaves of a large tensor go to torch's own intra-op threads: they are idle while the op's
// thread records, and their number is the one the program chose.
void on_torch_pool(size_t n, const std::function<void(size_t, size_t)>& fn) {
  at::parallel_for(0, int64_t(n), 1, [&](int64_t begin, int64_t end) { fn(size_t(begin), size_t(end)); });
}

}  // namespace

void describe_geometry(const at::Tensor& t, size_t digest_len, trace::TensorDesc* desc) {
  desc->dtype = uint8_t(t.scalar_type());
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
  // ours, not the program's: no RecordFunction callback (a profiler's) should see them. The guard
  // costs a rebuild of libtorch's thread-local callback list, so only this path pays for it.
  at::Tensor t = tensor;
  if (!t.device().is_cpu() || t.is_conj() || t.is_neg()) {
    at::RecordFunctionGuard no_recording(false);
    if (!t.device().is_cpu()) t = t.to(at::kCPU);
    if (t.is_conj()) t = t.resolve_conj();
    if (t.is_neg()) t = t.resolve_neg();
  }

  TensorDigester digester(hasher, desc->dtype, with_stats);
  if (t.numel() > 0) {
    if (t.is_contiguous())
      digester.update_all(t.data_ptr(), size_t(t.numel()) * size_t(t.element_size()), on_torch_pool);
    else
      feed_strided(t, &digester);
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
