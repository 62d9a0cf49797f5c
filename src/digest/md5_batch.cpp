#include "digest/md5_batch.h"

#include <algorithm>
#include <cstring>

#include "digest/md5_lanes.h"
#include "digest/stats.h"

namespace detaudit {

namespace {

constexpr size_t kBlock = Md5Lanes::kBlockBytes;

// A message of n bytes and MD5's padding: 0x80, zeros, and the length in bits.
constexpr size_t padded_blocks(size_t n) { return (n + 8) / kBlock + 1; }

}  // namespace

void Md5Batch::Result::fill(trace::TensorDesc* out) const {
  std::memcpy(out->digest.data(), digest.data(), 16);
  out->digest_len = 16;
  store_stats(has_stats ? &stats : nullptr, integral, out);
}

bool Md5Batch::available() { return Md5Lanes::available(); }

Md5Batch::Md5Batch() : single_(trace::DigestAlgo::kMd5) {}

bool Md5Batch::has_room(size_t n) const {
  return count_ < kMaxMessages && used_ + padded_blocks(n) * kBlock <= kArenaBytes;
}

uint8_t* Md5Batch::reserve(size_t n) {
  // Uninitialised: every byte a message's blocks cover is written before it is read.
  if (!arena_) arena_.reset(new uint8_t[kArenaBytes]);
  reserved_ = n;
  return arena_.get() + used_;
}

size_t Md5Batch::commit(trace::Dtype dtype, bool with_stats) {
  const Message m{used_, reserved_, padded_blocks(reserved_), dtype, with_stats};
  pad(m);
  used_ += m.blocks * kBlock;
  messages_[count_] = m;
  return count_++;
}

void Md5Batch::pad(const Message& m) {
  uint8_t* p = arena_.get() + m.offset;
  const size_t end = m.blocks * kBlock;
  p[m.bytes] = 0x80;
  std::memset(p + m.bytes + 1, 0, end - 8 - m.bytes - 1);
  const uint64_t bits = uint64_t(m.bytes) * 8;
  std::memcpy(p + end - 8, &bits, 8);  // little-endian on every platform we build for
}

void Md5Batch::statistics(const Message& m, Result* r) const {
  // As TensorDigester feeds a tensor: blocks of kStatsBlockBytes from its first byte.
  StatsAccumulator acc(m.dtype);
  r->integral = acc.integral();
  r->has_stats = m.with_stats && acc.supported();
  if (!r->has_stats) return;
  const uint8_t* p = arena_.get() + m.offset;
  for (size_t off = 0; off < m.bytes; off += kStatsBlockBytes)
    acc.update(p + off, std::min(kStatsBlockBytes, m.bytes - off));
  r->stats = acc.finish();
}

void Md5Batch::run() {
  for (size_t i = 0; i < count_; ++i) statistics(messages_[i], &results_[i]);
  if (count_ == 1) {
    single_.digest_once(arena_.get() + messages_[0].offset, messages_[0].bytes,
                        results_[0].digest.data());
    return;
  }
  if (count_ == 0) return;

  // Longest first: a lane freed by a short message takes the next, and the lanes end together.
  std::array<uint16_t, kMaxMessages> order;
  for (size_t i = 0; i < count_; ++i) order[i] = uint16_t(i);
  std::stable_sort(order.begin(), order.begin() + count_, [&](uint16_t a, uint16_t b) {
    return messages_[a].blocks > messages_[b].blocks;
  });

  struct Lane {
    size_t message;
    size_t blocks_left;
    const uint8_t* next;
  };
  Lane lanes[Md5Lanes::kLanes];
  size_t next = 0;
  auto start = [&](Lane* lane) {
    const size_t i = order[next++];
    *lane = {i, messages_[i].blocks, arena_.get() + messages_[i].offset};
  };
  size_t used = 0;
  while (used < Md5Lanes::kLanes && next < count_) start(&lanes[used++]);

  Md5Lanes md5;
  const uint8_t* pointers[Md5Lanes::kLanes];
  while (used > 0) {
    size_t step = lanes[0].blocks_left;
    for (size_t l = 1; l < used; ++l) step = std::min(step, lanes[l].blocks_left);
    for (size_t l = 0; l < Md5Lanes::kLanes; ++l) pointers[l] = lanes[l < used ? l : 0].next;
    md5.set_used(used);  // the busy lanes are always the first ones
    md5.update(pointers, step * kBlock);
    for (size_t l = 0; l < used; ++l) {
      lanes[l].blocks_left -= step;
      lanes[l].next += step * kBlock;
    }
    for (size_t l = 0; l < used;) {
      if (lanes[l].blocks_left > 0) {
        ++l;
        continue;
      }
      md5.lane_digest(l, results_[lanes[l].message].digest.data());
      if (next < count_) {
        md5.restart_lane(l);
        start(&lanes[l]);
        ++l;
      } else if (l != --used) {
        md5.move_lane(used, l);  // keeps the busy lanes first; lane l is looked at again
        lanes[l] = lanes[used];
      }
    }
  }
}

void Md5Batch::clear() {
  count_ = 0;
  used_ = 0;
}

}  // namespace detaudit
