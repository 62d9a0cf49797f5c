// Tensors' MD5 digests, many side by side in Md5Lanes' vector lanes.
//
// MD5 is one serial chain per message, about 0.6 GB/s a core whatever the CPU, and a model's
// tensors are mostly a few KiB, each hashed alone. The recorder copies such a tensor here when
// the op reaches it (the program may change or free it afterwards), and the batch hashes its
// tensors together when it is full or a digest is wanted. A tensor of several leaves is their tree
// (tensor_digester.h), each leaf a message of its own. A lane whose message ends takes the next
// one, longest first, so messages of any lengths share the lanes. Each digest and its statistics
// are what TensorDigester gives for the same bytes, bit for bit.
//
//   Md5Batch batch;
//   if (!batch.has_room(n)) { batch.run(); ...read results...; batch.clear(); }
//   std::memcpy(batch.reserve(n), data, n);
//   size_t i = batch.commit(dtype, with_stats);
//   ...
//   batch.run();   // result(i) holds tensor i's digest and statistics until clear()
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "digest/hashers.h"
#include "digest/stats.h"
#include "digest/tensor_digester.h"
#include "trace/format.h"

namespace detaudit {

class Md5Batch {
 public:
  // Larger tensors are hashed where they lie, their leaves on torch's threads (tensor_digest.h):
  // a copy costs more than the lanes save.
  static constexpr size_t kMaxTensorBytes = 4 * kLeafBytes;
  static constexpr size_t kMaxTensors = 512;
  static constexpr size_t kArenaBytes = size_t(32) << 20;

  struct Result {
    trace::DigestBytes digest{};
    trace::TensorStats stats{};
    bool has_stats = false;  // asked for, and the dtype has statistics
    bool integral = false;
    // Sets out's digest, its length and its statistics, as TensorDigester::finish() does.
    void fill(trace::TensorDesc* out) const;
  };

  // Where Md5Lanes runs (AVX-512F or AVX2); elsewhere nothing here may be called.
  static bool available();

  Md5Batch();
  // Whether a tensor of n bytes (0 < n <= kMaxTensorBytes) fits beside those committed.
  bool has_room(size_t n) const;
  // Room for the next tensor's n bytes, which the caller writes before commit(). has_room(n).
  uint8_t* reserve(size_t n);
  // The reserved tensor, of `dtype`; returns its index.
  size_t commit(trace::Dtype dtype, bool with_stats);
  size_t size() const { return count_; }
  bool full() const { return count_ == kMaxTensors; }
  // Digests and statistics of every committed tensor, on this thread; or with the lanes' work
  // cut into groups that `parallel` runs on up to `threads` threads. The same bits either way.
  void run();
  void run(const ParallelFor& parallel, size_t threads);
  const Result& result(size_t i) const { return room_->results[i]; }
  void clear();

 private:
  struct Tensor {
    size_t offset, bytes;  // in the arena, padded after its last leaf as MD5 pads it
    uint16_t first_leaf, leaves;
    trace::Dtype dtype;
    bool with_stats;
  };
  // One message in the lanes: a whole tensor, or one leaf of a larger one.
  struct Leaf {
    size_t offset, bytes;
    size_t blocks;       // of 64 bytes in the arena, the padding's included when it is there
    bool padding_apart;  // a full leaf before others: its padding block is kFullLeafPadding
    uint16_t tensor;
  };
  static constexpr size_t kMaxLeaves = kMaxTensors + kArenaBytes / kLeafBytes;

  void pad(const Tensor& t);
  void statistics(const Leaf& leaf);
  // Leaves in `order` (longest first) cut into groups of equal work, at most one a thread:
  // group g is grouped[begin[g], begin[g + 1]). Returns the number of groups.
  static constexpr size_t kMaxGroups = 16;
  size_t split_into_groups(const uint16_t* order, size_t threads, uint16_t* grouped,
                           size_t* begin) const;
  void digest_leaves(const uint16_t* leaves, size_t n);  // in the lanes, on the calling thread
  void finish_tensor(size_t i);

  // What a batch holds, allocated with its arena when the first tensor comes, not with the batch:
  // a thread's first op may be the program's allocation of a block just freed, and a garbage read
  // of it must still see what the program left there.
  struct Room {
    std::array<Tensor, kMaxTensors> tensors;
    std::array<Result, kMaxTensors> results;
    std::array<Leaf, kMaxLeaves> leaves;
    std::array<trace::DigestBytes, kMaxLeaves> leaf_digests;
    std::vector<StatsAccumulator> leaf_stats;  // one a leaf, its room kept across clear()
  };

  std::unique_ptr<uint8_t[]> arena_;
  std::unique_ptr<Room> room_;
  size_t used_ = 0;
  size_t reserved_ = 0;  // bytes of the tensor being written
  size_t count_ = 0;
  size_t leaf_count_ = 0;
  Hasher single_;  // a batch of one leaf: the serial MD5 is faster than a lane
};

}  // namespace detaudit
