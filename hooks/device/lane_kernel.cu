// The device digest's kernels (docs/trace-format.md, "The device digest"): a warp per 4 KiB leaf,
// then a block per tensor for the leaves' sum and statistics tree. The same functions as the CPU
// reference (src/digest/lane_digest.h); the only GPU-specific parts are who holds which lane and
// the fixed trees, built from shuffles and shared memory, never from floating-point atomics.
#include <cuda_runtime.h>

#include "device/lane_kernel.h"

namespace detaudit::device {
namespace {

using namespace lanes;

struct Batch {
  DigestJob jobs[kMaxBatch];
  uint64_t first_leaf[kMaxBatch +
                      1];  // prefix sums: job j's leaves are [first_leaf[j], first_leaf[j+1])
  int n;
};

__host__ __device__ uint64_t leaves_of(uint64_t bytes) {
  const uint64_t words = (bytes + 7) / 8;
  return (words + kLeafWords - 1) / kLeafWords;
}

// Word `k` of a tensor of `bytes` bytes: zero-padded past the end, read bytewise when the data is
// not 8-byte aligned (a view's offset).
__device__ uint64_t load_word(const uint8_t* p, uint64_t k, uint64_t bytes) {
  const uint64_t at = 8 * k;
  if (at + 8 <= bytes && (reinterpret_cast<uintptr_t>(p) & 7) == 0)
    return *reinterpret_cast<const uint64_t*>(p + at);
  uint64_t w = 0;
  for (int b = 0; b < 8 && at + b < bytes; ++b) w |= uint64_t(p[at + b]) << (8 * b);
  return w;
}

__device__ void shfl_down_stats(LaneStats* s, unsigned width) {
  LaneStats o;
  o.sum = __shfl_down_sync(0xffffffffu, s->sum, width);
  o.sumsq = __shfl_down_sync(0xffffffffu, s->sumsq, width);
  o.min = __shfl_down_sync(0xffffffffu, s->min, width);
  o.max = __shfl_down_sync(0xffffffffu, s->max, width);
  o.count = __shfl_down_sync(0xffffffffu, s->count, width);
  o.nan = __shfl_down_sync(0xffffffffu, s->nan, width);
  o.inf = __shfl_down_sync(0xffffffffu, s->inf, width);
  if ((threadIdx.x % kLanes) < width) fold_stats(s, o);
}

// One warp per leaf, over every leaf of the batch.
__global__ void leaf_kernel(Batch batch, uint64_t* leaf_hashes, LaneStats* leaf_stats) {
  const uint64_t total = batch.first_leaf[batch.n];
  const uint32_t lane = threadIdx.x % kLanes;
  const uint64_t warps = uint64_t(gridDim.x) * blockDim.x / kLanes;
  for (uint64_t g = (uint64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes; g < total;
       g += warps) {
    int j = 0;
    while (batch.first_leaf[j + 1] <= g) ++j;
    const DigestJob& job = batch.jobs[j];
    const uint64_t leaf = g - batch.first_leaf[j];
    const uint64_t words = (job.bytes + 7) / 8;
    const uint64_t first = leaf * kLeafWords;
    const uint32_t count = uint32_t(min(uint64_t(kLeafWords), words - first));
    const ElementType type = element_type(job.dtype);
    const auto* p = static_cast<const uint8_t*>(job.data);
    uint64_t acc = lane_seed(leaf, lane);
    LaneStats st = empty_stats();
    for (uint32_t k = lane; k < count; k += kLanes) {
      const uint64_t w = load_word(p, first + k, job.bytes);
      acc = xxh64_round(acc, w);
      if (type.kind != ElementKind::kNone) {
        const uint64_t left = job.bytes - 8 * (first + k);  // bytes from this word on
        add_word(&st, w, type, uint32_t(min(uint64_t(8), left) / type.size));
      }
    }
    for (unsigned width = kLanes / 2; width >= 1; width /= 2) {
      const uint64_t other = __shfl_down_sync(0xffffffffu, acc, width);
      if (lane < width) acc = fold_hash(acc, other);
      shfl_down_stats(&st, width);
    }
    if (lane == 0) {
      leaf_hashes[g] = leaf_hash(acc, count);
      leaf_stats[g] = st;
    }
  }
}

constexpr int kTreeThreads = 256;

// One block per tensor: the leaves' hashes add up (any order: integers), and their statistics
// fold level by level in place, v[i] = v[2i] + v[2i+1], an odd last one going up as it is.
__global__ void tensor_kernel(Batch batch, const uint64_t* leaf_hashes, LaneStats* leaf_stats,
                              LaneResult* results) {
  const int j = blockIdx.x;
  const uint64_t first = batch.first_leaf[j];
  uint64_t n = batch.first_leaf[j + 1] - first;
  __shared__ uint64_t sums[kTreeThreads];
  uint64_t sum = 0;
  for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) sum += leaf_hashes[first + i];
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s >= 1; s /= 2) {
    if (threadIdx.x < s) sums[threadIdx.x] += sums[threadIdx.x + s];
    __syncthreads();
  }
  LaneStats* v = leaf_stats + first;
  while (n > 1) {
    const uint64_t half = (n + 1) / 2;
    for (uint64_t base = 0; base < half; base += blockDim.x) {
      const uint64_t i = base + threadIdx.x;
      LaneStats s = empty_stats();
      if (i < half) {
        s = v[2 * i];
        if (2 * i + 1 < n) fold_stats(&s, v[2 * i + 1]);
      }
      __syncthreads();  // every read of this chunk before any write of it
      if (i < half) v[i] = s;
      __syncthreads();
    }
    n = half;
  }
  if (threadIdx.x == 0)
    results[j] = LaneResult{root_hash(sums[0], batch.jobs[j].bytes), n == 1 ? v[0] : empty_stats()};
}

Batch make_batch(const DigestJob* jobs, int n) {
  Batch b{};
  b.n = n;
  b.first_leaf[0] = 0;
  for (int j = 0; j < n; ++j) {
    b.jobs[j] = jobs[j];
    b.first_leaf[j + 1] = b.first_leaf[j] + leaves_of(jobs[j].bytes);
  }
  return b;
}

}  // namespace

int launch_lane_digest(const DigestJob* jobs, int n, void* scratch, LaneResult* results,
                       void* stream) {
  if (n <= 0 || n > kMaxBatch) return int(cudaErrorInvalidValue);
  const Batch batch = make_batch(jobs, n);
  const uint64_t leaves = batch.first_leaf[n];
  auto* hashes = static_cast<uint64_t*>(scratch);
  auto* stats = reinterpret_cast<LaneStats*>(hashes + leaves);
  auto s = static_cast<cudaStream_t>(stream);
  if (leaves > 0) {
    constexpr int kThreads = 256;  // 8 warps, 8 leaves a block a pass
    const uint64_t blocks = (leaves * kLanes + kThreads - 1) / kThreads;
    leaf_kernel<<<unsigned(blocks < 65535 * 16 ? blocks : 65535 * 16), kThreads, 0, s>>>(
        batch, hashes, stats);
  }
  tensor_kernel<<<unsigned(n), kTreeThreads, 0, s>>>(batch, hashes, stats, results);
  return int(cudaGetLastError());
}

}  // namespace detaudit::device
