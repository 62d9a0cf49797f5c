// The device digest on a GPU: one launch digests a batch of contiguous tensors on a stream, with
// the code of src/digest/lane_digest.h. Plain C++ (no CUDA types), so the interposer's C++ files
// include it; lane_kernel.cu is built by nvcc when the torch has CUDA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "digest/lane_digest.h"

namespace detaudit::device {

// Tensors per launch. The jobs travel as a kernel argument: 256 of them take 8 KiB of the 32 KiB
// that CUDA 12.1 and later allow on Volta and after.
inline constexpr int kMaxBatch = 256;

struct DigestJob {
  const void* data;  // contiguous, in device memory
  uint64_t bytes;
  uint8_t dtype;
};

// Leaves a block of the tree kernel folds into one entry: an aligned group of 2^k leaves folds
// to the entry the tensor's tree has k levels up, so groups fold side by side, then their entries.
inline constexpr uint32_t kGroupLeaves = 256;

// Device memory the launch needs: a hash and statistics a leaf, then a sum and statistics a
// group of leaves, and a counter a tensor.
inline size_t lane_scratch_bytes(const DigestJob* jobs, int n) {
  uint64_t leaves = 0, groups = 0;
  for (int j = 0; j < n; ++j) {
    const uint64_t words = (jobs[j].bytes + 7) / 8;
    const uint64_t l = (words + lanes::kLeafWords - 1) / lanes::kLeafWords;
    leaves += l;
    groups += l > kGroupLeaves ? (l + kGroupLeaves - 1) / kGroupLeaves : 1;
  }
  const size_t entry = sizeof(uint64_t) + sizeof(lanes::LaneStats);
  return size_t(leaves + groups) * entry + size_t(n) * sizeof(uint32_t);
}

// Enqueues the digest of jobs[0..n) (n <= kMaxBatch) on `stream` (a cudaStream_t); writes n
// LaneResults to `results` (device memory). Never synchronizes. Returns a CUDA error code, 0 if
// the launch was enqueued.
int launch_lane_digest(const DigestJob* jobs, int n, void* scratch, lanes::LaneResult* results,
                       void* stream);

}  // namespace detaudit::device
