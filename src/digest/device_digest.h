// The device digest's CPU reference: the same lanes, leaves and trees as the GPU kernel
// (lane_digest.h), fed a tensor's bytes in logical order in any split. CPU tensors of a stream that
// records with the device digest are digested here, and tests check the kernel against it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "digest/lane_digest.h"
#include "trace/format.h"

namespace detaudit {

class DeviceDigester {
 public:
  explicit DeviceDigester(trace::Dtype dtype, bool with_stats = true);
  void update(const void* data, size_t nbytes);
  lanes::LaneResult finish();
  uint64_t bytes() const { return bytes_; }

 private:
  void add_words(const uint8_t* p, size_t words);  // whole words, within the open leaf
  void add_word(uint64_t word, uint32_t elements);
  void close_leaf();

  lanes::ElementType type_;
  bool with_stats_;
  uint64_t bytes_ = 0;
  uint8_t tail_[8] = {};  // a word's first bytes, until the rest comes
  uint32_t tail_used_ = 0;
  uint64_t leaf_ = 0;  // the open leaf's index
  uint32_t words_in_leaf_ = 0;
  uint64_t leaf_sum_ = 0;  // of the closed leaves' hashes
  uint64_t acc_[lanes::kLanes];
  lanes::LaneStats lane_stats_[lanes::kLanes];
  // Closed leaves' statistics, merged as a binary counter: (stats, level), levels decreasing.
  // Folding what is left from the top at the end gives the spec's level-by-level pairwise tree.
  std::vector<std::pair<lanes::LaneStats, uint32_t>> stats_stack_;
};

// The device digest of `nbytes` contiguous bytes, without statistics.
uint64_t device_digest(const void* data, size_t nbytes);

// The device digest and statistics of `count` elements that are each `element`
// (`element_size` bytes, at most 16): a fill's bytes, digested without being there.
lanes::LaneResult device_digest_of_fill(trace::Dtype dtype, const void* element,
                                        size_t element_size, uint64_t count);

// Fills the digest (8 bytes, little-endian), the statistics and their bits of `out`.
void lane_result_to_desc(const lanes::LaneResult& r, trace::Dtype dtype, bool with_stats,
                         trace::TensorDesc* out);

}  // namespace detaudit
