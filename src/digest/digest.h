// Content digests (MD5 and SHA-256 via OpenSSL, XXH3-128) and statistics of tensor data,
// computed together in one pass over memory.
//
//   TensorDigester d(DigestAlgo::kMd5, /*dtype=*/6, /*with_stats=*/true);
//   d.update(ptr, nbytes);            // contiguous runs, in logical order
//   d.finish(&desc);                  // fills desc.digest and desc.stats
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "trace/format.h"

namespace detaudit {

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
class StatsAccumulator {
 public:
  explicit StatsAccumulator(uint8_t dtype);
  bool supported() const { return kind_ != Kind::kNone; }
  bool integral() const { return kind_ == Kind::kSigned || kind_ == Kind::kUnsigned; }
  void update(const void* data, size_t nbytes);
  trace::TensorStats finish() const;

 private:
  enum class Kind { kNone, kFloat, kDouble, kHalf, kBFloat16, kSigned, kUnsigned };
  Kind kind_ = Kind::kNone;
  size_t elem_size_ = 0;
  double min_, max_, sum_ = 0, sumsq_ = 0;
  uint64_t count_ = 0, nan_ = 0, inf_ = 0;
  int64_t imin_, imax_;
};

// Hash and statistics fed block by block so each block is read from cache twice, not from
// memory twice.
class TensorDigester {
 public:
  TensorDigester(Hasher* hasher, uint8_t dtype, bool with_stats);
  void update(const void* data, size_t nbytes);
  // Sets digest, digest_len, stats and the stats bits of `out`.
  void finish(trace::TensorDesc* out);
  uint64_t bytes() const { return bytes_; }

 private:
  Hasher* hasher_;
  StatsAccumulator stats_;
  bool with_stats_;
  uint64_t bytes_ = 0;
};

}  // namespace detaudit
