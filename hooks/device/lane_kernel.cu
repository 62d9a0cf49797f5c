// The device digest's kernels (docs/trace-format.md, "The device digest"): a warp per 4 KiB leaf,
// then a block per group of 256 leaves for their sum and statistics tree, the last block of a
// tensor folding its groups' entries. The same functions as the CPU
// reference (src/digest/lane_digest.h); the only GPU-specific parts are who holds which lane and
// the fixed trees, built from shuffles and shared memory, never from floating-point atomics.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "device/lane_kernel.h"

namespace detaudit::device {
namespace {

using namespace lanes;

struct Batch {
  DigestJob jobs[kMaxBatch];
  // Prefix sums: job j's leaves are [first_leaf[j], first_leaf[j+1]), its groups of leaves
  // [first_group[j], first_group[j+1]) (at least one, for an empty tensor too).
  uint64_t first_leaf[kMaxBatch + 1];
  uint32_t first_group[kMaxBatch + 1];
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

// The job whose prefix range holds `i`: the last j with first[j] <= i (first[0] = 0).
template <typename T>
__device__ int job_of(const T* first, int n, uint64_t i) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first[mid] <= i)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// The elements of a word as K, `Size` bytes each: the reference's add_word with the type known
// at compile time, so that the loop over a leaf's words has no branch on it.
template <ElementKind K, uint32_t Size>
__device__ __forceinline__ void add_word_as(LaneStats* s, uint64_t word) {
  constexpr ElementType t{K, uint8_t(Size)};
#pragma unroll
  for (uint32_t j = 0; j < 8 / Size; ++j) {
    if constexpr (K == ElementKind::kHalf) {
      // The hardware's conversion is exact; a NaN's payload differs, but a NaN is only counted.
      add_element(s, double(__half2float(__ushort_as_half(uint16_t(word >> (16 * j))))), true);
    } else {
      add_element(s, element_of_word(word, t, j), is_floating(K));
    }
  }
}

// A lane's share of a whole, 8-byte aligned leaf: its kWordsPerLane words are all loaded before
// any is hashed, so that they are in flight together.
template <ElementKind K, uint32_t Size>
__device__ __forceinline__ void whole_leaf(const uint64_t* words, uint64_t* acc, LaneStats* st) {
  uint64_t w[kWordsPerLane];
#pragma unroll
  for (uint32_t i = 0; i < kWordsPerLane; ++i) w[i] = __ldg(words + i * kLanes);
#pragma unroll
  for (uint32_t i = 0; i < kWordsPerLane; ++i) *acc = xxh64_round(*acc, w[i]);
  if constexpr (K != ElementKind::kNone) {
#pragma unroll
    for (uint32_t i = 0; i < kWordsPerLane; ++i) add_word_as<K, Size>(st, w[i]);
  }
}

__device__ void whole_leaf_of(ElementType t, const uint64_t* words, uint64_t* acc, LaneStats* st) {
  switch (t.kind) {
    case ElementKind::kUnsigned: return whole_leaf<ElementKind::kUnsigned, 1>(words, acc, st);
    case ElementKind::kSigned:
      switch (t.size) {
        case 1: return whole_leaf<ElementKind::kSigned, 1>(words, acc, st);
        case 2: return whole_leaf<ElementKind::kSigned, 2>(words, acc, st);
        case 4: return whole_leaf<ElementKind::kSigned, 4>(words, acc, st);
        default: return whole_leaf<ElementKind::kSigned, 8>(words, acc, st);
      }
    case ElementKind::kHalf: return whole_leaf<ElementKind::kHalf, 2>(words, acc, st);
    case ElementKind::kBFloat16: return whole_leaf<ElementKind::kBFloat16, 2>(words, acc, st);
    case ElementKind::kFloat: return whole_leaf<ElementKind::kFloat, 4>(words, acc, st);
    case ElementKind::kDouble: return whole_leaf<ElementKind::kDouble, 8>(words, acc, st);
    default: return whole_leaf<ElementKind::kNone, 1>(words, acc, st);
  }
}

// One warp per leaf, over every leaf of the batch. A whole aligned leaf is read at once; the
// group kernel's counters are zeroed here (it runs next on the stream).
__global__ void leaf_kernel(Batch batch, uint64_t* leaf_hashes, LaneStats* leaf_stats,
                            uint32_t* counters) {
  if (blockIdx.x == 0 && threadIdx.x < unsigned(batch.n)) counters[threadIdx.x] = 0;
  const uint64_t total = batch.first_leaf[batch.n];
  const uint32_t lane = threadIdx.x % kLanes;
  const uint64_t warps = uint64_t(gridDim.x) * blockDim.x / kLanes;
  for (uint64_t g = (uint64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes; g < total;
       g += warps) {
    const int j = job_of(batch.first_leaf, batch.n, g);
    const DigestJob& job = batch.jobs[j];
    const uint64_t leaf = g - batch.first_leaf[j];
    const uint64_t words = (job.bytes + 7) / 8;
    const uint64_t first = leaf * kLeafWords;
    const uint32_t count = uint32_t(min(uint64_t(kLeafWords), words - first));
    const ElementType type = element_type(job.dtype);
    const auto* p = static_cast<const uint8_t*>(job.data);
    uint64_t acc = lane_seed(leaf, lane);
    LaneStats st = empty_stats();
    if (count == kLeafWords && 8 * (first + kLeafWords) <= job.bytes &&
        (reinterpret_cast<uintptr_t>(p) & 7) == 0) {
      whole_leaf_of(type, reinterpret_cast<const uint64_t*>(p) + first + lane, &acc, &st);
    } else {
      for (uint32_t k = lane; k < count; k += kLanes) {
        const uint64_t w = load_word(p, first + k, job.bytes);
        acc = xxh64_round(acc, w);
        if (type.kind != ElementKind::kNone) {
          const uint64_t left = job.bytes - 8 * (first + k);
          add_word(&st, w, type, uint32_t(min(uint64_t(8), left) / type.size));
        }
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
static_assert(kTreeThreads == int(kGroupLeaves), "a thread a leaf of the group");

// The fixed tree over v[0..n) in shared memory, by the block: v[i] = v[2i] + v[2i+1] level by
// level, an odd last one going up as it is. Returns v[0] (empty statistics when n is 0).
__device__ LaneStats fold_in_block(LaneStats* v, uint32_t n) {
  while (n > 1) {
    const uint32_t half = (n + 1) / 2;
    LaneStats s;
    if (threadIdx.x < half) {
      s = v[2 * threadIdx.x];
      if (2 * threadIdx.x + 1 < n) fold_stats(&s, v[2 * threadIdx.x + 1]);
    }
    __syncthreads();
    if (threadIdx.x < half) v[threadIdx.x] = s;
    __syncthreads();
    n = half;
  }
  return n == 1 ? v[0] : empty_stats();
}

// Another block's entry, read past this SM's L1 (it was written by another SM).
__device__ LaneStats load_stats_cg(const LaneStats* p) {
  LaneStats s;
  s.sum = __ldcg(&p->sum);
  s.sumsq = __ldcg(&p->sumsq);
  s.min = __ldcg(&p->min);
  s.max = __ldcg(&p->max);
  s.count = __ldcg(reinterpret_cast<const unsigned long long*>(&p->count));
  s.nan = __ldcg(reinterpret_cast<const unsigned long long*>(&p->nan));
  s.inf = __ldcg(reinterpret_cast<const unsigned long long*>(&p->inf));
  return s;
}

// A block per group of kGroupLeaves leaves: the group's hash sum and folded statistics. A tensor
// of one group is finished there; otherwise the last of its groups to finish folds the groups'
// entries (a counter a tensor), so that a large tensor's tree is folded by many blocks.
__global__ void group_kernel(Batch batch, const uint64_t* leaf_hashes, const LaneStats* leaf_stats,
                             uint64_t* group_sums, LaneStats* group_stats, uint32_t* counters,
                             LaneResult* results) {
  __shared__ LaneStats v[kTreeThreads];
  __shared__ uint64_t sums[kTreeThreads];
  __shared__ bool last;
  const int j = job_of(batch.first_group, batch.n, blockIdx.x);
  const uint32_t groups = batch.first_group[j + 1] - batch.first_group[j];
  const uint32_t group = blockIdx.x - batch.first_group[j];
  const uint64_t leaves = batch.first_leaf[j + 1] - batch.first_leaf[j];
  const uint64_t begin = batch.first_leaf[j] + uint64_t(group) * kGroupLeaves;
  const uint32_t n = uint32_t(
      min(uint64_t(kGroupLeaves), leaves - min(leaves, uint64_t(group) * kGroupLeaves)));
  sums[threadIdx.x] = threadIdx.x < n ? leaf_hashes[begin + threadIdx.x] : 0;
  if (threadIdx.x < n) v[threadIdx.x] = leaf_stats[begin + threadIdx.x];
  __syncthreads();
  for (int s = kTreeThreads / 2; s >= 1; s /= 2) {
    if (threadIdx.x < s) sums[threadIdx.x] += sums[threadIdx.x + s];
    __syncthreads();
  }
  const LaneStats folded = fold_in_block(v, n);
  if (groups == 1) {
    if (threadIdx.x == 0) results[j] = LaneResult{root_hash(sums[0], batch.jobs[j].bytes), folded};
    return;
  }
  const uint32_t at = batch.first_group[j] + group;
  if (threadIdx.x == 0) {
    group_sums[at] = sums[0];
    group_stats[at] = folded;
    __threadfence();  // the entry before the count: the last block reads it
    last = atomicAdd(&counters[j], 1u) == groups - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  // The groups' entries, kTreeThreads at a time into shared memory, each chunk an aligned group
  // of groups folded to its entry, the chunks' entries then folded in the same way.
  const uint32_t first = batch.first_group[j];
  uint64_t sum = 0;
  uint32_t chunks = 0;
  for (uint32_t base = 0; base < groups; base += kTreeThreads) {
    const uint32_t m = min(uint32_t(kTreeThreads), groups - base);
    if (threadIdx.x < m) {
      sum += __ldcg(
          reinterpret_cast<const unsigned long long*>(group_sums + first + base + threadIdx.x));
      v[threadIdx.x] = load_stats_cg(group_stats + first + base + threadIdx.x);
    }
    __syncthreads();
    const LaneStats chunk = fold_in_block(v, m);
    // The chunk's entry goes back where the chunk's first group was: read again below.
    if (threadIdx.x == 0) group_stats[first + chunks] = chunk;
    ++chunks;
    __syncthreads();
  }
  // At most kTreeThreads chunks (launch_lane_digest refuses more): one more fold.
  if (threadIdx.x < chunks) v[threadIdx.x] = group_stats[first + threadIdx.x];
  __syncthreads();
  const LaneStats all = fold_in_block(v, chunks);
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (int s = kTreeThreads / 2; s >= 1; s /= 2) {
    if (threadIdx.x < s) sums[threadIdx.x] += sums[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) results[j] = LaneResult{root_hash(sums[0], batch.jobs[j].bytes), all};
}

Batch make_batch(const DigestJob* jobs, int n) {
  Batch b{};
  b.n = n;
  b.first_leaf[0] = 0;
  b.first_group[0] = 0;
  for (int j = 0; j < n; ++j) {
    b.jobs[j] = jobs[j];
    const uint64_t leaves = leaves_of(jobs[j].bytes);
    b.first_leaf[j + 1] = b.first_leaf[j] + leaves;
    b.first_group[j + 1] = b.first_group[j] +
                           uint32_t(leaves > kGroupLeaves
                                        ? (leaves + kGroupLeaves - 1) / kGroupLeaves
                                        : 1);
  }
  return b;
}

}  // namespace

int launch_lane_digest(const DigestJob* jobs, int n, void* scratch, LaneResult* results,
                       void* stream) {
  if (n <= 0 || n > kMaxBatch) return int(cudaErrorInvalidValue);
  const Batch batch = make_batch(jobs, n);
  // The last block folds at most kTreeThreads chunks of kTreeThreads groups: 2^24 leaves, 64 GiB.
  for (int j = 0; j < n; ++j)
    if (batch.first_group[j + 1] - batch.first_group[j] > uint32_t(kTreeThreads * kTreeThreads))
      return int(cudaErrorInvalidValue);
  const uint64_t leaves = batch.first_leaf[n];
  auto* hashes = static_cast<uint64_t*>(scratch);
  auto* stats = reinterpret_cast<LaneStats*>(hashes + leaves);
  auto s = static_cast<cudaStream_t>(stream);
  constexpr int kThreads = 256;  // 8 warps, 8 leaves a block a pass
  const uint64_t blocks = (leaves * kLanes + kThreads - 1) / kThreads;
  const unsigned grid = unsigned(blocks < 65535 * 16 ? blocks : 65535 * 16);
  const uint32_t groups = batch.first_group[n];
  auto* group_sums = reinterpret_cast<uint64_t*>(stats + leaves);
  auto* group_stats = reinterpret_cast<LaneStats*>(group_sums + groups);
  auto* counters = reinterpret_cast<uint32_t*>(group_stats + groups);
  // Counters are needed only by a tensor of several groups, which has leaves: the leaf kernel
  // runs and zeroes them.
  if (leaves > 0) leaf_kernel<<<grid, kThreads, 0, s>>>(batch, hashes, stats, counters);
  group_kernel<<<groups, kTreeThreads, 0, s>>>(batch, hashes, stats, group_sums, group_stats,
                                               counters, results);
  return int(cudaGetLastError());
}

}  // namespace detaudit::device
