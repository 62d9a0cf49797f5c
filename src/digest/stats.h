// Statistics of tensor data (min, max, mean, L2, NaN and Inf counts) in a summation order fixed
// by the elements' indices, with SIMD paths that all give the same bits (stats.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "digest/lane_digest.h"
#include "trace/format.h"

namespace detaudit {

inline constexpr size_t kStatsBlockBytes = 16 * 1024;
// Within a block, element j is summed in lane j % kStatsLanes; lanes fold pairwise at the block's
// end (stats.cpp, docs/trace-format.md). The order of the additions is part of the statistics.
inline constexpr size_t kStatsLanes = 16;

// Statistics of a tensor's elements: min, max, mean, L2 norm, NaN and Inf counts for floating
// dtypes; min, max and mean for integers and bool. NaNs are left out of min/max/mean/L2.
// The sums are added in an order fixed by the elements' indices (stats.cpp), so every host
// gives the same bits for the same bytes, whatever its vector unit.
class StatsAccumulator {
 public:
  explicit StatsAccumulator(trace::Dtype dtype);
  bool supported() const { return kind_ != Kind::kNone; }
  bool integral() const { return kind_ == Kind::kSigned || kind_ == Kind::kUnsigned; }
  // The elements at data, cut into blocks of kStatsBlockBytes from data on: feed a tensor in
  // pieces that are whole blocks (the last may be short), as TensorDigester does.
  void update(const void* data, size_t nbytes);
  // Folds in the statistics of the elements that follow this accumulator's.
  void merge(const StatsAccumulator& next);
  trace::TensorStats finish() const;

 private:
  using Kind = lanes::ElementKind;
  void update_block(const uint8_t* p, size_t n);  // n elements, at most one block
  Kind kind_ = Kind::kNone;
  size_t elem_size_ = 0;
  double min_, max_, sum_ = 0, sumsq_ = 0;
  uint64_t count_ = 0, nan_ = 0, inf_ = 0;
  int64_t imin_, imax_;
};

// The stored statistics from running sums: mean and L2 from the sums, no L2 for integers, and a
// zero min or max as +0.0 (which zero a min or max keeps depends on the operand order).
trace::TensorStats summarize_stats(double min, double max, double sum, double sumsq, uint64_t count,
                                   uint64_t nan, uint64_t inf, bool integral);
// Sets out's statistics and their bits; with no statistics (null), clears the bits.
void store_stats(const trace::TensorStats* stats, bool integral, trace::TensorDesc* out);

// The code paths of the float statistics. Each computes the same lanes, so each gives the same
// bits; kAuto takes the fastest the CPU has. For tests and benchmarks: force_stats_path is global
// and not meant to change while tensors are being digested.
enum class StatsPath { kAuto, kPortable, kAvx2, kAvx512 };
bool stats_path_available(StatsPath p);
void force_stats_path(StatsPath p);  // kAuto, or a path that is not available: the fastest

}  // namespace detaudit
