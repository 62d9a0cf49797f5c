// A tensor's digest and statistics, computed together in one pass over memory.
//
//   TensorDigester d(&hasher, /*dtype=*/6, /*with_stats=*/true);
//   d.update(ptr, nbytes);            // contiguous runs, in logical order
//   d.finish(&desc);                  // fills desc.digest and desc.stats
//
// A tensor of up to kLeafBytes is digested as its bytes. A larger one is cut into leaves of
// kLeafBytes, which can be hashed in parallel; its digest is the digest of a tree header and the
// leaves' digests (docs/trace-format.md). Leaves are fixed, so the digest and the statistics do
// not depend on the thread count or on how the bytes were fed. The device digest has leaves of its
// own, and its own statistics order (device_digest.h): TensorDigester hands it the bytes whole.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "digest/device_digest.h"
#include "digest/hashers.h"
#include "digest/stats.h"
#include "trace/format.h"

namespace detaudit {

inline constexpr size_t kLeafBytes = size_t(1) << 20;
static_assert(kLeafBytes % kStatsBlockBytes == 0, "no statistics block straddles two leaves");

// A tensor of several leaves: its digest is the hasher's over this header (reset first), then the
// leaves' digests in order (docs/trace-format.md).
void begin_tree_digest(Hasher* hasher, uint64_t tensor_bytes);

// Runs fn(begin, end) over disjoint ranges covering [0, n), possibly on several threads.
using ParallelFor = std::function<void(size_t n, const std::function<void(size_t, size_t)>& fn)>;

// Hash and statistics fed block by block so each block is read from cache twice, not from
// memory twice. Statistics see fixed blocks at fixed offsets, whatever the split of the input.
class TensorDigester {
 public:
  TensorDigester(Hasher* hasher, trace::Dtype dtype, bool with_stats);
  void update(const void* data, size_t nbytes);
  // The whole tensor at once, contiguous: its leaves are hashed through `parallel`, on up to
  // `threads` threads, a small tensor in one call to the hasher. Same digest and statistics as
  // update(); call it instead of update(), not after.
  void update_all(const void* data, size_t nbytes, const ParallelFor& parallel, size_t threads = 1);
  // Sets digest, digest_len, stats and the stats bits of `out`.
  void finish(trace::TensorDesc* out);
  uint64_t bytes() const { return bytes_; }

 private:
  struct Leaf {
    trace::DigestBytes digest{};
    StatsAccumulator stats;
    explicit Leaf(trace::Dtype dtype) : stats(dtype) {}
  };
  void feed_leaf(const uint8_t* p, size_t n);  // within the current leaf
  // Whole leaves [from, to) of a contiguous tensor at p, at most 16, in MD5's vector lanes.
  void digest_leaves_md5(const uint8_t* p, size_t from, size_t to);
  void close_leaf();
  void flush_carry();

  Hasher* hasher_;
  trace::Dtype dtype_;
  bool with_stats_;
  uint64_t bytes_ = 0;
  size_t leaf_used_ = 0;  // bytes in the open leaf
  StatsAccumulator leaf_stats_;
  // A partial statistics block; inline, so digesting a small tensor allocates nothing.
  std::array<uint8_t, kStatsBlockBytes> carry_;
  size_t carry_used_ = 0;
  std::vector<Leaf> closed_;  // leaves before the open one
  bool whole_ = false;        // update_all() digested a one-leaf tensor into whole_digest_
  trace::DigestBytes whole_digest_{};
  std::optional<DeviceDigester> device_;  // the device digest instead of all the above
};

}  // namespace detaudit
