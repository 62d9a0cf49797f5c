// Content digests (MD5 and SHA-256 via OpenSSL, XXH3-128) and statistics of tensor data,
// computed together in one pass over memory.
//
//   TensorDigester d(DigestAlgo::kMd5, /*dtype=*/6, /*with_stats=*/true);
//   d.update(ptr, nbytes);            // contiguous runs, in logical order
//   d.finish(&desc);                  // fills desc.digest and desc.stats
//
// A tensor of up to kLeafBytes is digested as its bytes. A larger one is cut into leaves of
// kLeafBytes, which can be hashed in parallel; its digest is the digest of a tree header and the
// leaves' digests (docs/trace-format.md). Leaves are fixed, so the digest and the statistics do
// not depend on the thread count or on how the bytes were fed.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "trace/format.h"

namespace detaudit {

inline constexpr size_t kLeafBytes = size_t(1) << 20;
inline constexpr size_t kStatsBlockBytes = 16 * 1024;  // divides kLeafBytes: no block straddles two leaves
// Within a block, element j is summed in lane j % kStatsLanes; lanes fold pairwise at the block's
// end (digest.cpp, docs/trace-format.md). The order of the additions is part of the statistics.
inline constexpr size_t kStatsLanes = 16;

class Hasher {
 public:
  explicit Hasher(trace::DigestAlgo algo);
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  trace::DigestAlgo algo() const { return algo_; }
  size_t length() const { return trace::digest_length(algo_); }
  void reset();
  void update(const void* data, size_t n);
  void finish(uint8_t* out);  // length() bytes; reset() before reuse

 private:
  struct State;
  trace::DigestAlgo algo_;
  std::unique_ptr<State> state_;
};

// Statistics of a tensor's elements: min, max, mean, L2 norm, NaN and Inf counts for floating
// dtypes; min, max and mean for integers and bool. NaNs are left out of min/max/mean/L2.
// The sums are added in an order fixed by the elements' indices (digest.cpp), so every host
// gives the same bits for the same bytes, whatever its vector unit.
class StatsAccumulator {
 public:
  explicit StatsAccumulator(uint8_t dtype);
  bool supported() const { return kind_ != Kind::kNone; }
  bool integral() const { return kind_ == Kind::kSigned || kind_ == Kind::kUnsigned; }
  // The elements at data, cut into blocks of kStatsBlockBytes from data on: feed a tensor in
  // pieces that are whole blocks (the last may be short), as TensorDigester does.
  void update(const void* data, size_t nbytes);
  // Folds in the statistics of the elements that follow this accumulator's.
  void merge(const StatsAccumulator& next);
  trace::TensorStats finish() const;

 private:
  enum class Kind { kNone, kFloat, kDouble, kHalf, kBFloat16, kSigned, kUnsigned };
  void update_block(const uint8_t* p, size_t n);  // n elements, at most one block
  Kind kind_ = Kind::kNone;
  size_t elem_size_ = 0;
  double min_, max_, sum_ = 0, sumsq_ = 0;
  uint64_t count_ = 0, nan_ = 0, inf_ = 0;
  int64_t imin_, imax_;
};

// The code paths of the float statistics. Each computes the same lanes, so each gives the same
// bits; kAuto takes the fastest the CPU has. For tests and benchmarks: force_stats_path is global
// and not meant to change while tensors are being digested.
enum class StatsPath { kAuto, kPortable, kAvx2, kAvx512 };
bool stats_path_available(StatsPath p);
void force_stats_path(StatsPath p);  // kAuto, or a path that is not available: the fastest

// Runs fn(begin, end) over disjoint ranges covering [0, n), possibly on several threads.
using ParallelFor = std::function<void(size_t n, const std::function<void(size_t, size_t)>& fn)>;

// Hash and statistics fed block by block so each block is read from cache twice, not from
// memory twice. Statistics see fixed blocks at fixed offsets, whatever the split of the input.
class TensorDigester {
 public:
  TensorDigester(Hasher* hasher, uint8_t dtype, bool with_stats);
  void update(const void* data, size_t nbytes);
  // The whole tensor at once, contiguous: its leaves are hashed through `parallel`. Same digest
  // and statistics as update(); call it instead of update(), not after.
  void update_all(const void* data, size_t nbytes, const ParallelFor& parallel);
  // Sets digest, digest_len, stats and the stats bits of `out`.
  void finish(trace::TensorDesc* out);
  uint64_t bytes() const { return bytes_; }

 private:
  struct Leaf {
    trace::DigestBytes digest{};
    StatsAccumulator stats;
    explicit Leaf(uint8_t dtype) : stats(dtype) {}
  };
  void feed_leaf(const uint8_t* p, size_t n);  // within the current leaf
  // Whole leaves [from, to) of a contiguous tensor at p, at most 16, in MD5's vector lanes.
  void digest_leaves_md5(const uint8_t* p, size_t from, size_t to);
  void close_leaf();
  void flush_carry();

  Hasher* hasher_;
  uint8_t dtype_;
  bool with_stats_;
  uint64_t bytes_ = 0;
  size_t leaf_used_ = 0;  // bytes in the open leaf
  StatsAccumulator leaf_stats_;
  // A partial statistics block; inline, so digesting a small tensor allocates nothing.
  std::array<uint8_t, kStatsBlockBytes> carry_;
  size_t carry_used_ = 0;
  std::vector<Leaf> closed_;    // leaves before the open one
};

}  // namespace detaudit
