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

// Device memory the launch needs for its leaves' partial results: a hash and statistics a leaf.
inline size_t lane_scratch_bytes(const DigestJob* jobs, int n) {
  uint64_t leaves = 0;
  for (int j = 0; j < n; ++j) {
    const uint64_t words = (jobs[j].bytes + 7) / 8;
    leaves += (words + lanes::kLeafWords - 1) / lanes::kLeafWords;
  }
  return size_t(leaves) * (sizeof(uint64_t) + sizeof(lanes::LaneStats));
}

// Enqueues the digest of jobs[0..n) (n <= kMaxBatch) on `stream` (a cudaStream_t); writes n
// LaneResults to `results` (device memory). Never synchronizes. Returns a CUDA error code, 0 if
// the launch was enqueued.
int launch_lane_digest(const DigestJob* jobs, int n, void* scratch, lanes::LaneResult* results,
                       void* stream);

}  // namespace detaudit::device
