#include "digest/device_digest.h"

#include <algorithm>
#include <cstring>

#include "digest/stats.h"

// Built with -ffp-contract=off (src/CMakeLists.txt): a fused x * x + q would round once, and the
// kernel's statistics would no longer equal these.
#if defined(__FAST_MATH__)
#error "device_digest.cpp must not be built with -ffast-math: it is the kernel's reference"
#endif

namespace detaudit {

using namespace lanes;

DeviceDigester::DeviceDigester(trace::Dtype dtype, bool with_stats)
    : type_(element_type(dtype)), with_stats_(with_stats && type_.kind != ElementKind::kNone) {
  for (uint32_t l = 0; l < kLanes; ++l) {
    acc_[l] = lane_seed(0, l);
    lane_stats_[l] = empty_stats();
  }
}

void DeviceDigester::add_word(uint64_t word, uint32_t elements) {
  const uint32_t lane = words_in_leaf_ % kLanes;
  acc_[lane] = xxh64_round(acc_[lane], word);
  if (with_stats_) lanes::add_word(&lane_stats_[lane], word, type_, elements);
  if (++words_in_leaf_ == kLeafWords) close_leaf();
}

void DeviceDigester::add_words(const uint8_t* p, size_t words) {
  const uint32_t per_word = 8 / type_.size;
  size_t i = 0;
  // Up to the start of a row, word by word; then whole rows of lanes, side by side.
  for (; i < words && words_in_leaf_ % kLanes != 0; ++i) {
    uint64_t w;
    std::memcpy(&w, p + 8 * i, 8);
    add_word(w, per_word);
  }
  for (; i + kLanes <= words; i += kLanes) {
    uint64_t row[kLanes];
    std::memcpy(row, p + 8 * i, sizeof row);  // little-endian hosts only (the build targets)
    for (uint32_t l = 0; l < kLanes; ++l) acc_[l] = xxh64_round(acc_[l], row[l]);
    if (with_stats_)
      for (uint32_t l = 0; l < kLanes; ++l)
        lanes::add_word(&lane_stats_[l], row[l], type_, per_word);
    words_in_leaf_ += kLanes;
    if (words_in_leaf_ == kLeafWords) close_leaf();
  }
  for (; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, p + 8 * i, 8);
    add_word(w, per_word);
  }
}

void DeviceDigester::update(const void* data, size_t nbytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  bytes_ += nbytes;
  if (tail_used_ > 0) {
    const size_t take = std::min<size_t>(nbytes, 8 - tail_used_);
    std::memcpy(tail_ + tail_used_, p, take);
    tail_used_ += uint32_t(take);
    p += take;
    nbytes -= take;
    if (tail_used_ < 8) return;
    add_words(tail_, 1);
    tail_used_ = 0;
  }
  add_words(p, nbytes / 8);
  tail_used_ = uint32_t(nbytes % 8);
  std::memcpy(tail_, p + nbytes - tail_used_, tail_used_);
}

void DeviceDigester::close_leaf() {
  // The lanes fold pairwise, as a warp's shuffles do: lane l takes lane l + w, w = 16, 8, 4, 2, 1.
  for (uint32_t w = kLanes / 2; w >= 1; w /= 2)
    for (uint32_t l = 0; l < w; ++l) {
      acc_[l] = fold_hash(acc_[l], acc_[l + w]);
      fold_stats(&lane_stats_[l], lane_stats_[l + w]);
    }
  leaf_sum_ += leaf_hash(acc_[0], words_in_leaf_);
  stats_stack_.emplace_back(lane_stats_[0], 0);
  while (stats_stack_.size() >= 2 &&
         stats_stack_[stats_stack_.size() - 2].second == stats_stack_.back().second) {
    const LaneStats right = stats_stack_.back().first;
    stats_stack_.pop_back();
    fold_stats(&stats_stack_.back().first, right);
    ++stats_stack_.back().second;
  }
  ++leaf_;
  words_in_leaf_ = 0;
  for (uint32_t l = 0; l < kLanes; ++l) {
    acc_[l] = lane_seed(leaf_, l);
    lane_stats_[l] = empty_stats();
  }
}

LaneResult DeviceDigester::finish() {
  if (tail_used_ > 0) {
    std::memset(tail_ + tail_used_, 0, 8 - tail_used_);
    add_word(
        [&] {
          uint64_t w;
          std::memcpy(&w, tail_, 8);
          return w;
        }(),
        tail_used_ / type_.size);
    tail_used_ = 0;
  }
  if (words_in_leaf_ > 0) close_leaf();
  LaneResult r{root_hash(leaf_sum_, bytes_), empty_stats()};
  while (stats_stack_.size() >= 2) {
    const LaneStats right = stats_stack_.back().first;
    stats_stack_.pop_back();
    fold_stats(&stats_stack_.back().first, right);
  }
  if (!stats_stack_.empty()) r.stats = stats_stack_.back().first;
  return r;
}

uint64_t device_digest(const void* data, size_t nbytes) {
  DeviceDigester d(trace::Dtype::kUInt8, /*with_stats=*/false);
  d.update(data, nbytes);
  return d.finish().root;
}

LaneResult device_digest_of_fill(trace::Dtype dtype, const void* element, size_t element_size,
                                 uint64_t count) {
  // The element repeated over a chunk that holds whole elements, fed chunk by chunk.
  constexpr size_t kChunk = 4096;
  uint8_t chunk[kChunk];
  const size_t per_chunk = element_size ? kChunk / element_size : 0;
  for (size_t i = 0; i < per_chunk; ++i)
    std::memcpy(chunk + i * element_size, element, element_size);
  DeviceDigester d(dtype);
  for (uint64_t left = count; left > 0 && per_chunk > 0;) {
    const uint64_t n = std::min<uint64_t>(left, per_chunk);
    d.update(chunk, size_t(n) * element_size);
    left -= n;
  }
  return d.finish();
}

void lane_result_to_desc(const LaneResult& r, trace::Dtype dtype, bool with_stats,
                         trace::TensorDesc* out) {
  for (int i = 0; i < 8; ++i) out->digest[size_t(i)] = uint8_t(r.root >> (8 * i));
  out->digest_len = 8;
  const ElementType type = element_type(dtype);
  const bool integral = !is_floating(type.kind);
  const LaneStats& s = r.stats;
  const trace::TensorStats stats = summarize_stats(s.min, s.max, s.sum, s.sumsq, s.count, s.nan,
                                                   s.inf, integral);
  store_stats(with_stats && type.kind != ElementKind::kNone ? &stats : nullptr, integral, out);
}

}  // namespace detaudit
