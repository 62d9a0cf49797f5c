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

// A job as the kernel takes it: the strided ones' geometry apart, so that the argument stays small.
struct KernelJob {
  const void* data;
  uint64_t bytes;
  trace::Dtype dtype;
  int8_t geometry;  // -1: contiguous; else an entry of Batch::geometry
};

struct Batch {
  KernelJob jobs[kMaxBatch];
  JobGeometry geometry[kMaxStridedJobs];
  // Prefix sums: job j's leaves are [first_leaf[j], first_leaf[j+1]), its groups of leaves
  // [first_group[j], first_group[j+1]) (at least one, for an empty tensor too).
  uint64_t first_leaf[kMaxBatch + 1];
  uint32_t first_group[kMaxBatch + 1];
  int n;
};

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

// Word `k` of a strided view's logical bytes, gathered element by element (its elements are
// aligned to their size, as a tensor's are), zero-padded past the end.
__device__ uint64_t load_strided_word(const uint8_t* p, const JobGeometry& g, uint64_t k,
                                      uint64_t bytes) {
  const uint32_t size = g.elem_size;
  uint64_t w = 0;
  uint64_t element = 8 * k / size;
  for (uint32_t m = 0; m < 8 / size && (element + 1) * size <= bytes; ++m, ++element) {
    int64_t at = 0;
    uint64_t rest = element;
    for (int d = int(g.dims) - 1; d >= 0; --d) {
      const uint64_t n = uint64_t(g.sizes[d]);
      at += int64_t(rest % n) * g.strides[d];
      rest /= n;
    }
    const uint8_t* e = p + at * int64_t(size);
    uint64_t v;
    switch (size) {
      case 1: v = *e; break;
      case 2: v = *reinterpret_cast<const uint16_t*>(e); break;
      case 4: v = *reinterpret_cast<const uint32_t*>(e); break;
      default: v = *reinterpret_cast<const uint64_t*>(e); break;
    }
    w |= v << (8 * size * m);  // m is 0 for 8-byte elements
  }
  return w;
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

// The warp's digest of leaf `leaf` of `job`: its hash and statistics, in lane 0. A whole aligned
// leaf of a contiguous tensor is read at once.
__device__ void digest_leaf(const Batch& batch, const KernelJob& job, uint64_t leaf, uint32_t lane,
                            uint64_t* hash, LaneStats* stats) {
  const uint64_t words = (job.bytes + 7) / 8;
  const uint64_t first = leaf * kLeafWords;
  const uint32_t count = uint32_t(min(uint64_t(kLeafWords), words - first));
  const ElementType type = element_type(job.dtype);
  const auto* p = static_cast<const uint8_t*>(job.data);
  uint64_t acc = lane_seed(leaf, lane);
  LaneStats st = empty_stats();
  if (job.geometry < 0 && count == kLeafWords && 8 * (first + kLeafWords) <= job.bytes &&
      (reinterpret_cast<uintptr_t>(p) & 7) == 0) {
    whole_leaf_of(type, reinterpret_cast<const uint64_t*>(p) + first + lane, &acc, &st);
  } else {
    for (uint32_t k = lane; k < count; k += kLanes) {
      const uint64_t w = job.geometry < 0 ? load_word(p, first + k, job.bytes)
                                          : load_strided_word(p, batch.geometry[job.geometry],
                                                              first + k, job.bytes);
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
  *hash = leaf_hash(acc, count);
  *stats = st;
}

// Two-pass: one warp per leaf, over every leaf of the batch; the group kernel's counters are
// zeroed here (it runs next on the stream).
__global__ void leaf_kernel(Batch batch, uint64_t* leaf_hashes, LaneStats* leaf_stats,
                            uint32_t* counters) {
  if (blockIdx.x == 0 && threadIdx.x < unsigned(batch.n)) counters[threadIdx.x] = 0;
  const uint64_t total = batch.first_leaf[batch.n];
  const uint32_t lane = threadIdx.x % kLanes;
  const uint64_t warps = uint64_t(gridDim.x) * blockDim.x / kLanes;
  for (uint64_t g = (uint64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes; g < total;
       g += warps) {
    const int j = job_of(batch.first_leaf, batch.n, g);
    uint64_t hash;
    LaneStats st;
    digest_leaf(batch, batch.jobs[j], g - batch.first_leaf[j], lane, &hash, &st);
    if (lane == 0) {
      leaf_hashes[g] = hash;
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

// Where a block's group lies: tensor j, its group of groups, and its n leaves.
struct GroupPlace {
  int j;
  uint32_t groups, group, n;
  uint64_t first_leaf;  // the group's first leaf in the batch
};

__device__ GroupPlace group_place(const Batch& batch) {
  GroupPlace g;
  g.j = job_of(batch.first_group, batch.n, blockIdx.x);
  g.groups = batch.first_group[g.j + 1] - batch.first_group[g.j];
  g.group = blockIdx.x - batch.first_group[g.j];
  const uint64_t leaves = batch.first_leaf[g.j + 1] - batch.first_leaf[g.j];
  g.first_leaf = batch.first_leaf[g.j] + uint64_t(g.group) * kGroupLeaves;
  g.n = uint32_t(
      min(uint64_t(kGroupLeaves), leaves - min(leaves, uint64_t(g.group) * kGroupLeaves)));
  return g;
}

// The block's group, its leaves' hashes in sums[0..kTreeThreads) (zero past n) and statistics in
// v[0..n): the group's hash sum and folded statistics. A tensor of one group is finished here;
// otherwise the last of its groups to finish folds the groups' entries (`counter`, the tensor's,
// counts them; set back to zero after when `reset_counter`), so that a large tensor's tree is
// folded by many blocks.
__device__ void fold_group(const Batch& batch, const GroupPlace& g, uint64_t* sums, LaneStats* v,
                           bool* last, uint64_t* group_sums, LaneStats* group_stats,
                           uint32_t* counter, bool reset_counter, LaneResult* results) {
  __syncthreads();
  for (int s = kTreeThreads / 2; s >= 1; s /= 2) {
    if (threadIdx.x < s) sums[threadIdx.x] += sums[threadIdx.x + s];
    __syncthreads();
  }
  const int j = g.j;
  const uint32_t groups = g.groups;
  const LaneStats folded = fold_in_block(v, g.n);
  if (groups == 1) {
    if (threadIdx.x == 0) results[j] = LaneResult{root_hash(sums[0], batch.jobs[j].bytes), folded};
    return;
  }
  const uint32_t at = batch.first_group[j] + g.group;
  if (threadIdx.x == 0) {
    group_sums[at] = sums[0];
    group_stats[at] = folded;
    __threadfence();  // the entry before the count: the last block reads it
    *last = atomicAdd(counter, 1u) == groups - 1;
    if (*last && reset_counter) *counter = 0;  // every group has counted
  }
  __syncthreads();
  if (!*last) return;
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

// Two-pass: a block per group, from the leaf kernel's entries.
__global__ void group_kernel(Batch batch, const uint64_t* leaf_hashes, const LaneStats* leaf_stats,
                             uint64_t* group_sums, LaneStats* group_stats, uint32_t* counters,
                             LaneResult* results) {
  __shared__ LaneStats v[kTreeThreads];
  __shared__ uint64_t sums[kTreeThreads];
  __shared__ bool last;
  const GroupPlace g = group_place(batch);
  sums[threadIdx.x] = threadIdx.x < g.n ? leaf_hashes[g.first_leaf + threadIdx.x] : 0;
  if (threadIdx.x < g.n) v[threadIdx.x] = leaf_stats[g.first_leaf + threadIdx.x];
  fold_group(batch, g, sums, v, &last, group_sums, group_stats, &counters[g.j],
             /*reset_counter=*/false, results);
}

// Fused: a block per group, its warps digesting its leaves into shared memory, then folding as
// the group kernel does; the launch's last block writes `seq` to `done` (mapped pinned memory)
// after every block's results. One launch, no scratch for leaves, and counters that every
// launch leaves at zero (counters[0] the launch's, counters[1 + j] tensor j's).
__global__ void fused_kernel(Batch batch, uint64_t* group_sums, LaneStats* group_stats,
                             uint32_t* counters, LaneResult* results, volatile uint64_t* done,
                             uint64_t seq) {
  __shared__ LaneStats v[kTreeThreads];
  __shared__ uint64_t sums[kTreeThreads];
  __shared__ bool last;
  const GroupPlace g = group_place(batch);
  const KernelJob& job = batch.jobs[g.j];
  const uint32_t lane = threadIdx.x % kLanes;
  if (threadIdx.x >= g.n) sums[threadIdx.x] = 0;
  // Warp-uniform: every lane of a warp takes the same leaves (the digest shuffles across them).
  for (uint32_t i = threadIdx.x / kLanes; i < g.n; i += kTreeThreads / kLanes) {
    uint64_t hash;
    LaneStats st;
    digest_leaf(batch, job, uint64_t(g.group) * kGroupLeaves + i, lane, &hash, &st);
    if (lane == 0) {
      sums[i] = hash;
      v[i] = st;
    }
  }
  fold_group(batch, g, sums, v, &last, group_sums, group_stats, &counters[1 + g.j],
             /*reset_counter=*/true, results);
  if (threadIdx.x != 0) return;
  // This block's result (written by this thread) seen by the host before it counts.
  __threadfence_system();
  if (atomicAdd(&counters[0], 1u) != gridDim.x - 1) return;
  counters[0] = 0;
  __threadfence_system();  // every block's results before the word
  *done = seq;
}

// False when the batch has more strided jobs than the kernel's argument has room for.
bool make_batch(const DigestJob* jobs, int n, Batch* batch) {
  Batch& b = *batch;
  b.n = n;
  b.first_leaf[0] = 0;
  b.first_group[0] = 0;
  int strided = 0;
  for (int j = 0; j < n; ++j) {
    b.jobs[j] = {jobs[j].data, jobs[j].bytes, jobs[j].dtype, -1};
    if (jobs[j].strided) {
      if (strided == kMaxStridedJobs) return false;
      b.geometry[strided] = jobs[j].geometry;
      b.jobs[j].geometry = int8_t(strided++);
    }
    const uint64_t leaves = leaves_of(jobs[j].bytes);
    b.first_leaf[j + 1] = b.first_leaf[j] + leaves;
    b.first_group[j + 1] = b.first_group[j] + uint32_t(groups_of(leaves));
  }
  return true;
}

}  // namespace

namespace {

// The batch of jobs[0..n), or false when a tensor has more leaves than the last block can fold
// (kTreeThreads chunks of kTreeThreads groups: 2^24 leaves, 64 GiB).
bool batch_of(const DigestJob* jobs, int n, Batch* batch) {
  if (n <= 0 || n > kMaxBatch || !make_batch(jobs, n, batch)) return false;
  for (int j = 0; j < n; ++j)
    if (batch->first_group[j + 1] - batch->first_group[j] > uint32_t(kTreeThreads * kTreeThreads))
      return false;
  return true;
}

}  // namespace

int launch_lane_digest(const DigestJob* jobs, int n, void* scratch, LaneResult* results,
                       void* stream) {
  Batch batch{};
  if (!batch_of(jobs, n, &batch)) return int(cudaErrorInvalidValue);
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

int launch_fused_digest(const DigestJob* jobs, int n, void* scratch, LaneResult* results,
                        volatile uint64_t* done, uint64_t seq, void* stream) {
  Batch batch{};
  if (!batch_of(jobs, n, &batch)) return int(cudaErrorInvalidValue);
  const uint32_t groups = batch.first_group[n];
  auto* counters = static_cast<uint32_t*>(scratch);
  auto* group_sums = reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(scratch) + kCounterBytes);
  auto* group_stats = reinterpret_cast<LaneStats*>(group_sums + groups);
  fused_kernel<<<groups, kTreeThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      batch, group_sums, group_stats, counters, results, done, seq);
  return int(cudaGetLastError());
}

}  // namespace detaudit::device
