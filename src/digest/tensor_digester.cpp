#include "digest/tensor_digester.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "digest/md5_lanes.h"

namespace detaudit {

using trace::DigestAlgo;

namespace {

constexpr size_t kStatsBlock = kStatsBlockBytes;
// Up to here a tensor is hashed in one call and its statistics then read it again from cache;
// beyond, the two go block by block, so memory is read once (a 1 MiB tensor read twice ran the
// CNN's hashing at 0.6x).
constexpr size_t kOneCallBytes = 64 * 1024;

// One leaf, contiguous, in one call: what the streaming path computes for the same bytes.
void digest_leaf(Hasher* h, const uint8_t* p, size_t n, bool with_stats, uint8_t* digest,
                 StatsAccumulator* stats) {
  h->reset();
  for (size_t off = 0; off < n; off += kStatsBlock) {
    const size_t m = std::min(kStatsBlock, n - off);
    h->update(p + off, m);
    if (with_stats) stats->update(p + off, m);
  }
  h->finish(digest);
}

// A hasher per thread and algorithm, for the leaves a pool thread hashes.
Hasher& thread_hasher(DigestAlgo algo) {
  thread_local std::unique_ptr<Hasher> hashers[4];
  auto& h = hashers[size_t(algo) & 3];
  if (!h || h->algo() != algo) h = std::make_unique<Hasher>(algo);
  return *h;
}

// A lane pass's time in serial MD5s of the same bytes, for 8 lanes or fewer and for 16. A pass
// costs about the same however many of its lanes carry leaves, so a few leaves on idle threads
// are done sooner one by one. Measured once per process (about 0.2 ms), as it depends on the
// CPU: 2.4 on an AVX-512 host (2026-11-25, `git show 8326e54:docs/performance.md`, fourth round).
double lane_pass_cost(size_t used) {
  static const std::array<double, 2> cost = [] {
    constexpr size_t kBytes = 16 << 10;
    std::vector<uint8_t> buf(kBytes, 0x5a);
    const uint8_t* lanes[Md5Lanes::kLanes];
    for (const uint8_t*& l : lanes) l = buf.data();
    volatile uint8_t sink = 0;
    auto fastest = [&](auto&& fn) {
      double best = std::numeric_limits<double>::infinity();
      for (int rep = 0; rep < 3; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        fn();
        best = std::min(
            best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      return std::max(best, 1e-9);
    };
    Hasher serial(DigestAlgo::kMd5);
    uint8_t digest[16];
    const double one = fastest([&] {
      serial.digest_once(buf.data(), kBytes, digest);
      sink = sink ^ digest[0];
    });
    auto pass = [&](size_t used) {
      return fastest([&] {
        Md5Lanes md5(used);
        md5.update(lanes, kBytes);
        md5.lane_digest(0, digest);
        sink = sink ^ digest[0];
      });
    };
    return std::array<double, 2>{pass(Md5Lanes::kLanes / 2) / one, pass(Md5Lanes::kLanes) / one};
  }();
  return cost[used > Md5Lanes::kLanes / 2];
}

}  // namespace

void begin_tree_digest(Hasher* hasher, uint64_t tensor_bytes) {
  // A header that no plain tensor of these bytes could collide with by accident.
  static constexpr char kTreeTag[16] = "detaudit-tree-1";
  const uint64_t sizes[2] = {kLeafBytes, tensor_bytes};
  hasher->reset();
  hasher->update(kTreeTag, sizeof kTreeTag);
  hasher->update(sizes, sizeof sizes);  // little-endian on every platform we build for
}

TensorDigester::TensorDigester(Hasher* hasher, trace::Dtype dtype, bool with_stats)
    : hasher_(hasher), dtype_(dtype), leaf_stats_(dtype) {
  with_stats_ = with_stats && leaf_stats_.supported();
  if (hasher_->algo() == DigestAlgo::kDevice)
    device_.emplace(dtype, with_stats_);
  else
    hasher_->reset();
}

void TensorDigester::update(const void* data, size_t nbytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  bytes_ += nbytes;
  if (device_) {
    device_->update(p, nbytes);
    return;
  }
  while (nbytes > 0) {
    // A leaf closes only when more bytes follow: a tensor of exactly one leaf is hashed plain.
    if (leaf_used_ == kLeafBytes) close_leaf();
    const size_t take = std::min(nbytes, kLeafBytes - leaf_used_);
    feed_leaf(p, take);
    p += take;
    nbytes -= take;
  }
}

void TensorDigester::feed_leaf(const uint8_t* p, size_t n) {
  leaf_used_ += n;
  hasher_->update(p, n);
  if (!with_stats_) return;
  if (carry_used_ > 0) {
    const size_t take = std::min(n, kStatsBlock - carry_used_);
    std::memcpy(carry_.data() + carry_used_, p, take);
    carry_used_ += take;
    p += take;
    n -= take;
    if (carry_used_ < kStatsBlock) return;
    leaf_stats_.update(carry_.data(), carry_used_);
    carry_used_ = 0;
  }
  for (; n >= kStatsBlock; p += kStatsBlock, n -= kStatsBlock) leaf_stats_.update(p, kStatsBlock);
  std::memcpy(carry_.data(), p, n);
  carry_used_ = n;
}

void TensorDigester::flush_carry() {
  if (carry_used_ > 0) leaf_stats_.update(carry_.data(), carry_used_);
  carry_used_ = 0;
}

void TensorDigester::close_leaf() {
  flush_carry();
  closed_.emplace_back(dtype_);
  hasher_->finish(closed_.back().digest.data());
  closed_.back().stats = leaf_stats_;
  hasher_->reset();
  leaf_stats_ = StatsAccumulator(dtype_);
  leaf_used_ = 0;
}

void TensorDigester::update_all(const void* data, size_t nbytes, const ParallelFor& parallel,
                                size_t threads) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (bytes_ != 0 || device_) {
    update(data, nbytes);
    return;
  }
  if (nbytes <= kOneCallBytes || (nbytes <= kLeafBytes && !with_stats_)) {
    hasher_->digest_once(p, nbytes, whole_digest_.data());
    for (size_t off = 0; with_stats_ && off < nbytes; off += kStatsBlock)
      leaf_stats_.update(p + off, std::min(kStatsBlock, nbytes - off));
    bytes_ = nbytes;
    whole_ = true;
    return;
  }
  if (nbytes <= kLeafBytes) {
    update(data, nbytes);
    return;
  }
  const size_t leaves = (nbytes + kLeafBytes - 1) / kLeafBytes;
  closed_.assign(leaves, Leaf(dtype_));
  const DigestAlgo algo = hasher_->algo();
  const bool with_stats = with_stats_;
  // MD5 of whole leaves runs 16 at a time in vector lanes (AVX-512, or AVX2); a pass costs
  // about the same for 2 leaves as for 16, so the leaves are spread over as few passes as there
  // must be, unless the threads hash them one by one sooner.
  const size_t full = nbytes / kLeafBytes;
  bool lanes = algo == DigestAlgo::kMd5 && full >= 2 && Md5Lanes::available();
  size_t passes = lanes ? (full + Md5Lanes::kLanes - 1) / Md5Lanes::kLanes : 0;
  if (lanes) {
    threads = std::max<size_t>(threads, 1);
    const double one_by_one = double((leaves + threads - 1) / threads);
    const double in_lanes = double((passes + threads - 1) / threads) *
                            lane_pass_cost(full / passes);
    lanes = in_lanes < one_by_one;
    if (!lanes) passes = 0;
  }
  const size_t first_single = lanes ? full : 0;  // leaves from here on are hashed one by one
  parallel(passes + leaves - first_single, [&](size_t begin, size_t end) {
    for (size_t unit = begin; unit < end; ++unit) {
      if (unit < passes) {
        const size_t from = full * unit / passes, to = full * (unit + 1) / passes;
        digest_leaves_md5(p, from, to);
        continue;
      }
      const size_t i = first_single + (unit - passes);
      const size_t off = i * kLeafBytes;
      digest_leaf(&thread_hasher(algo), p + off, std::min(kLeafBytes, nbytes - off), with_stats,
                  closed_[i].digest.data(), &closed_[i].stats);
    }
  });
  bytes_ = nbytes;
}

void TensorDigester::digest_leaves_md5(const uint8_t* p, size_t from, size_t to) {
  const size_t n = to - from;
  const uint8_t* lane[Md5Lanes::kLanes];
  for (size_t l = 0; l < Md5Lanes::kLanes; ++l)  // spare lanes hash leaf `from` again, unread
    lane[l] = p + (from + (l < n ? l : 0)) * kLeafBytes;
  Md5Lanes md5(n);
  // Block by block, so the statistics read what the hash just brought into cache.
  for (size_t off = 0; off < kLeafBytes; off += kStatsBlock) {
    md5.update(lane, kStatsBlock);
    for (size_t l = 0; with_stats_ && l < n; ++l)
      closed_[from + l].stats.update(lane[l], kStatsBlock);
    for (const uint8_t*& q : lane) q += kStatsBlock;
  }
  uint8_t digests[Md5Lanes::kLanes][16];
  md5.finish(kLeafBytes, digests);
  for (size_t l = 0; l < n; ++l) std::memcpy(closed_[from + l].digest.data(), digests[l], 16);
}

void TensorDigester::finish(trace::TensorDesc* out) {
  if (device_) {
    lane_result_to_desc(device_->finish(), dtype_, with_stats_, out);
    return;
  }
  StatsAccumulator total(dtype_);
  if (whole_) {
    std::memcpy(out->digest.data(), whole_digest_.data(), hasher_->length());
    total = leaf_stats_;
    whole_ = false;
  } else if (closed_.empty()) {
    flush_carry();
    hasher_->finish(out->digest.data());
    total = leaf_stats_;
  } else {
    if (leaf_used_ > 0) close_leaf();
    begin_tree_digest(hasher_, bytes_);
    for (const Leaf& leaf : closed_) {
      hasher_->update(leaf.digest.data(), hasher_->length());
      total.merge(leaf.stats);
    }
    hasher_->finish(out->digest.data());
    closed_.clear();
  }
  out->digest_len = uint8_t(hasher_->length());
  const trace::TensorStats stats = total.finish();
  store_stats(with_stats_ ? &stats : nullptr, total.integral(), out);
}

}  // namespace detaudit