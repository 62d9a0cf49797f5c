#include "digest/md5_batch.h"

#include <algorithm>
#include <cstring>

#include "digest/md5_lanes.h"
#include "util/balance.h"

namespace detaudit {

namespace {

constexpr size_t kBlock = Md5Lanes::kBlockBytes;

// A message of n bytes and MD5's padding: 0x80, zeros, and the length in bits.
constexpr size_t padded_blocks(size_t n) { return (n + 8) / kBlock + 1; }

// What follows a whole leaf of a larger tensor: its own padding, the same for every such leaf.
struct FullLeafPadding {
  alignas(64) uint8_t block[kBlock] = {0x80};
  FullLeafPadding() {
    const uint64_t bits = uint64_t(kLeafBytes) * 8;
    std::memcpy(block + kBlock - 8, &bits, 8);  // little-endian on every platform we build for
  }
};
const FullLeafPadding kFullLeafPadding;

}  // namespace

void Md5Batch::Result::fill(trace::TensorDesc* out) const {
  std::memcpy(out->digest.data(), digest.data(), 16);
  out->digest_len = 16;
  store_stats(has_stats ? &stats : nullptr, integral, out);
}

bool Md5Batch::available() { return Md5Lanes::available(); }

Md5Batch::Md5Batch() : single_(trace::DigestAlgo::kMd5) {}

bool Md5Batch::has_room(size_t n) const {
  return count_ < kMaxTensors && used_ + padded_blocks(n) * kBlock <= kArenaBytes;
}

uint8_t* Md5Batch::reserve(size_t n) {
  // Uninitialised: every byte a message's blocks cover is written before it is read.
  if (!arena_) {
    arena_.reset(new uint8_t[kArenaBytes]);
    room_ = std::make_unique<Room>();
    room_->leaf_stats.reserve(kMaxLeaves);
  }
  reserved_ = n;
  return arena_.get() + used_;
}

size_t Md5Batch::commit(trace::Dtype dtype, bool with_stats) {
  // A tensor of exactly one leaf is hashed plain, as TensorDigester does.
  const size_t leaves = std::max<size_t>(1, (reserved_ + kLeafBytes - 1) / kLeafBytes);
  const Tensor t{used_, reserved_, uint16_t(leaf_count_), uint16_t(leaves), dtype, with_stats};
  pad(t);
  for (size_t l = 0; l < leaves; ++l) {
    const bool last = l + 1 == leaves;
    const size_t bytes = last ? t.bytes - l * kLeafBytes : kLeafBytes;
    room_->leaves[leaf_count_] = {t.offset + l * kLeafBytes, bytes,
                                  last ? padded_blocks(bytes) : kLeafBytes / kBlock, !last,
                                  uint16_t(count_)};
    room_->leaf_stats.emplace_back(dtype);
    ++leaf_count_;
  }
  used_ += padded_blocks(t.bytes) * kBlock;
  room_->tensors[count_] = t;
  return count_++;
}

void Md5Batch::pad(const Tensor& t) {
  // After the last leaf: its length is the leaf's, not the tensor's.
  const size_t last_leaf = t.leaves == 1 ? t.bytes : t.bytes - (t.leaves - 1) * kLeafBytes;
  uint8_t* p = arena_.get() + t.offset;
  const size_t end = padded_blocks(t.bytes) * kBlock;
  p[t.bytes] = 0x80;
  std::memset(p + t.bytes + 1, 0, end - 8 - t.bytes - 1);
  const uint64_t bits = uint64_t(last_leaf) * 8;
  std::memcpy(p + end - 8, &bits, 8);  // little-endian on every platform we build for
}

void Md5Batch::statistics(const Leaf& leaf) {
  // As TensorDigester feeds a leaf: blocks of kStatsBlockBytes from its first byte.
  const Tensor& t = room_->tensors[leaf.tensor];
  if (!t.with_stats) return;
  StatsAccumulator& acc = room_->leaf_stats[size_t(&leaf - room_->leaves.data())];
  if (!acc.supported()) return;
  const uint8_t* p = arena_.get() + leaf.offset;
  for (size_t off = 0; off < leaf.bytes; off += kStatsBlockBytes)
    acc.update(p + off, std::min(kStatsBlockBytes, leaf.bytes - off));
}

void Md5Batch::run() {
  run([](size_t n, const std::function<void(size_t, size_t)>& fn) { fn(0, n); }, 1);
}

void Md5Batch::run(const ParallelFor& parallel, size_t threads) {
  if (count_ == 0) return;
  if (leaf_count_ == 1) {
    statistics(room_->leaves[0]);
    single_.digest_once(arena_.get() + room_->leaves[0].offset, room_->leaves[0].bytes,
                        room_->leaf_digests[0].data());
  } else {
    // Longest first: a lane freed by a short message takes the next, and the lanes end together.
    std::array<uint16_t, kMaxLeaves> order;
    for (size_t i = 0; i < leaf_count_; ++i) order[i] = uint16_t(i);
    std::stable_sort(order.begin(), order.begin() + leaf_count_, [&](uint16_t a, uint16_t b) {
      return room_->leaves[a].blocks > room_->leaves[b].blocks;
    });
    std::array<uint16_t, kMaxLeaves> grouped;
    std::array<size_t, kMaxGroups + 1> begin;
    const size_t groups = split_into_groups(order.data(), threads, grouped.data(), begin.data());
    parallel(groups, [&](size_t from, size_t to) {
      for (size_t g = from; g < to; ++g) {
        for (size_t k = begin[g]; k < begin[g + 1]; ++k) statistics(room_->leaves[grouped[k]]);
        digest_leaves(grouped.data() + begin[g], begin[g + 1] - begin[g]);
      }
    });
  }
  for (size_t i = 0; i < count_; ++i) finish_tensor(i);
}

size_t Md5Batch::split_into_groups(const uint16_t* order, size_t threads, uint16_t* grouped,
                                   size_t* begin) const {
  // A pass costs about the same for 8 lanes as for 16: a group gets 8 leaves at least, and the
  // groups are balanced by blocks.
  const size_t groups = std::clamp<size_t>(std::min(threads, leaf_count_ / 8), 1, kMaxGroups);
  std::array<uint8_t, kMaxLeaves> group_of{};
  balance_groups<kMaxGroups>(
      leaf_count_, groups, [&](size_t k) { return room_->leaves[order[k]].blocks; },
      group_of.data());
  std::fill(begin, begin + groups + 1, size_t(0));
  for (size_t k = 0; k < leaf_count_; ++k) ++begin[group_of[k] + 1];
  for (size_t g = 0; g < groups; ++g) begin[g + 1] += begin[g];
  std::array<size_t, kMaxGroups> next;
  std::copy(begin, begin + groups, next.begin());
  for (size_t k = 0; k < leaf_count_; ++k) grouped[next[group_of[k]]++] = order[k];
  return groups;
}

void Md5Batch::digest_leaves(const uint16_t* leaves, size_t n) {
  struct Lane {
    size_t leaf;
    size_t blocks_left;
    const uint8_t* next;
    bool padding_next;  // kFullLeafPadding once the leaf's blocks are in
  };
  Lane lanes[Md5Lanes::kLanes];
  size_t next = 0;
  auto start = [&](Lane* lane) {
    const Leaf& leaf = room_->leaves[leaves[next++]];
    *lane = {size_t(&leaf - room_->leaves.data()), leaf.blocks, arena_.get() + leaf.offset,
             leaf.padding_apart};
  };
  size_t used = 0;
  while (used < Md5Lanes::kLanes && next < n) start(&lanes[used++]);

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
      Lane& lane = lanes[l];
      if (lane.blocks_left > 0) {
        ++l;
        continue;
      }
      if (lane.padding_next) {
        lane = {lane.leaf, 1, kFullLeafPadding.block, false};
        ++l;
        continue;
      }
      md5.lane_digest(l, room_->leaf_digests[lane.leaf].data());
      if (next < n) {
        md5.restart_lane(l);
        start(&lane);
        ++l;
      } else if (l != --used) {
        md5.move_lane(used, l);  // keeps the busy lanes first; lane l is looked at again
        lane = lanes[used];
      }
    }
  }
}

void Md5Batch::finish_tensor(size_t i) {
  const Tensor& t = room_->tensors[i];
  Result& r = room_->results[i];
  StatsAccumulator total(t.dtype);
  r.integral = total.integral();
  r.has_stats = t.with_stats && total.supported();
  if (t.leaves == 1) {
    r.digest = room_->leaf_digests[t.first_leaf];
    total = room_->leaf_stats[t.first_leaf];
  } else {
    begin_tree_digest(&single_, t.bytes);
    for (size_t l = t.first_leaf; l < size_t(t.first_leaf) + t.leaves; ++l) {
      single_.update(room_->leaf_digests[l].data(), 16);
      total.merge(room_->leaf_stats[l]);
    }
    single_.finish(r.digest.data());
  }
  if (r.has_stats) r.stats = total.finish();
}

void Md5Batch::clear() {
  count_ = 0;
  used_ = 0;
  leaf_count_ = 0;
  if (room_) room_->leaf_stats.clear();
}

}  // namespace detaudit
