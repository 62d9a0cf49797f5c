// Small tensors' MD5 digests, many side by side in Md5Lanes' vector lanes.
//
// MD5 is one serial chain per message, about 0.6 GB/s a core whatever the CPU, and a small-op
// model's tensors are mostly a few KiB, each hashed alone. The recorder copies such a tensor here
// when the op reaches it (the program may change or free it afterwards), and the batch hashes its
// messages together when it is full or a digest is wanted. A lane whose message ends takes the
// next one, longest first, so messages of any lengths share the lanes. Each digest and its
// statistics are what TensorDigester gives for the same bytes, bit for bit.
//
//   Md5Batch batch;
//   if (!batch.has_room(n)) { batch.run(); ...read results...; batch.clear(); }
//   std::memcpy(batch.reserve(n), data, n);
//   size_t i = batch.commit(dtype, with_stats);
//   ...
//   batch.run();   // result(i) holds message i's digest and statistics until clear()
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "digest/hashers.h"
#include "trace/format.h"

namespace detaudit {

class Md5Batch {
 public:
  // One leaf at most: a larger tensor's digest is a tree over leaves (tensor_digester.h).
  static constexpr size_t kMaxMessageBytes = size_t(1) << 20;
  static constexpr size_t kMaxMessages = 128;
  static constexpr size_t kArenaBytes = size_t(16) << 20;

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
  // Whether a message of n bytes (0 < n <= kMaxMessageBytes) fits beside those committed.
  bool has_room(size_t n) const;
  // Room for the next message's n bytes, which the caller writes before commit(). has_room(n).
  uint8_t* reserve(size_t n);
  // The reserved message, of a tensor of `dtype`; returns its index.
  size_t commit(trace::Dtype dtype, bool with_stats);
  size_t size() const { return count_; }
  bool full() const { return count_ == kMaxMessages; }
  // Digests and statistics of every committed message.
  void run();
  const Result& result(size_t i) const { return results_[i]; }
  void clear();

 private:
  struct Message {
    size_t offset, bytes, blocks;  // blocks: of 64 bytes, padding included
    trace::Dtype dtype;
    bool with_stats;
  };
  void pad(const Message& m);
  void statistics(const Message& m, Result* r) const;

  std::unique_ptr<uint8_t[]> arena_;  // messages, each padded as MD5 pads it
  size_t used_ = 0;
  size_t reserved_ = 0;  // bytes of the message being written
  std::array<Message, kMaxMessages> messages_;
  std::array<Result, kMaxMessages> results_;
  size_t count_ = 0;
  Hasher single_;  // a batch of one message: the serial MD5 is faster than a lane
};

}  // namespace detaudit
