// The device digest on a GPU: one launch digests a batch of tensors on a stream, with the code of
// src/digest/lane_digest.h. Plain C++ (no CUDA types), so the interposer's C++ files
// include it; lane_kernel.cu is built by nvcc when the torch has CUDA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "digest/lane_digest.h"

namespace detaudit::device {

// Tensors per launch. The jobs travel as a kernel argument: 256 of them, with the strided ones'
// geometry, take 13 KiB of the 32 KiB that CUDA 12.1 and later allow on Volta and after.
inline constexpr int kMaxBatch = 256;
// Strided views a launch reads in place, and their dimensions once merged (a transpose, a slice
// of columns, a broadcast, channels_last: 2 or 3).
inline constexpr int kMaxStridedJobs = 64;
inline constexpr int kMaxJobDims = 3;

// A view's layout, in elements of elem_size bytes (1, 2, 4 or 8): its elements in logical
// (row-major) order are at data + elem_size * sum(index[d] * strides[d]).
struct JobGeometry {
  int64_t sizes[kMaxJobDims];
  int64_t strides[kMaxJobDims];
  uint8_t dims;
  uint8_t elem_size;
};

struct DigestJob {
  const void* data;  // in device memory: the bytes, or the view's first element
  uint64_t bytes;    // in logical order
  trace::Dtype dtype;
  bool strided = false;  // read through `geometry` (only where the queue reads_strided())
  JobGeometry geometry = {};
};

// Leaves a block of the tree kernel folds into one entry: an aligned group of 2^k leaves folds
// to the entry the tensor's tree has k levels up, so groups fold side by side, then their entries.
inline constexpr uint32_t kGroupLeaves = 256;

// The leaves of a tensor of `bytes` bytes, and their groups (at least one, for an empty tensor
// too): the kernels' layout, and their scratch's.
inline uint64_t leaves_of(uint64_t bytes) {
  const uint64_t words = (bytes + 7) / 8;
  return (words + lanes::kLeafWords - 1) / lanes::kLeafWords;
}
inline uint64_t groups_of(uint64_t leaves) {
  return leaves > kGroupLeaves ? (leaves + kGroupLeaves - 1) / kGroupLeaves : 1;
}

// Device memory the launch needs: a hash and statistics a leaf, then a sum and statistics a
// group of leaves, and a counter a tensor.
inline size_t lane_scratch_bytes(const DigestJob* jobs, int n) {
  uint64_t leaves = 0, groups = 0;
  for (int j = 0; j < n; ++j) {
    const uint64_t l = leaves_of(jobs[j].bytes);
    leaves += l;
    groups += groups_of(l);
  }
  const size_t entry = sizeof(uint64_t) + sizeof(lanes::LaneStats);
  return size_t(leaves + groups) * entry + size_t(n) * sizeof(uint32_t);
}

// Enqueues the digest of jobs[0..n) (n <= kMaxBatch) on `stream` (a cudaStream_t) in two
// kernels, leaves then groups; writes n LaneResults to `results` (device memory). Never
// synchronizes. Returns a CUDA error code, 0 if the launch was enqueued.
int launch_lane_digest(const DigestJob* jobs, int n, void* scratch, lanes::LaneResult* results,
                       void* stream);

// The fused kernel's scratch: counters first (the launch's, and one a tensor), which each launch
// leaves at zero, so that scratch zeroed once serves every launch; then a sum and statistics a
// group of leaves. No entry a leaf: a block digests its group's leaves into shared memory.
inline constexpr size_t kCounterBytes = 2048;
static_assert(kCounterBytes >= (kMaxBatch + 1) * sizeof(uint32_t), "a counter a tensor");

inline size_t fused_scratch_bytes(const DigestJob* jobs, int n) {
  uint64_t groups = 0;
  for (int j = 0; j < n; ++j) groups += groups_of(leaves_of(jobs[j].bytes));
  return kCounterBytes + size_t(groups) * (sizeof(uint64_t) + sizeof(lanes::LaneStats));
}

// The same digest in one kernel, whose last block stores `seq` into *done (mapped pinned memory)
// once every result is written: the launch is the only CUDA call, and its completion is read
// from *done. `scratch` (fused_scratch_bytes) must hold zeroed counters.
int launch_fused_digest(const DigestJob* jobs, int n, void* scratch, lanes::LaneResult* results,
                        volatile uint64_t* done, uint64_t seq, void* stream);

}  // namespace detaudit::device
