// A thread's last fills' digests, by dtype, element and count: programs fill alike again and
// again (sum's zeros, a gradient's zero_, each step), so each is digested once. Direct-mapped:
// one probe, a new fill taking its slot. Torch-free; Result is the digest's own form (the device
// digest's LaneResult, a CPU digest's TensorDesc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "trace/format.h"

namespace detaudit::hooks {

template <typename Result>
class RememberedFills {
 public:
  // The remembered result of filling `count` elements of `dtype` with `element` (its `size`
  // bytes as the kernel stores it), or null.
  const Result* find(trace::Dtype dtype, const uint8_t* element, size_t size, uint64_t count) {
    const Slot& s = slot(dtype, element, size, count);
    return s.count == count && s.dtype == dtype && std::memcmp(s.element, element, size) == 0
               ? &s.result
               : nullptr;
  }
  const Result& remember(trace::Dtype dtype, const uint8_t* element, size_t size, uint64_t count,
                         const Result& result) {
    Slot& s = slot(dtype, element, size, count);
    s.dtype = dtype;
    std::memcpy(s.element, element, size);
    s.count = count;
    s.result = result;
    return s.result;
  }

 private:
  struct Slot {
    trace::Dtype dtype = trace::Dtype::kUInt8;
    uint8_t element[16] = {};
    uint64_t count = 0;  // 0: empty
    Result result{};
  };
  static constexpr size_t kSlots = 64;

  Slot& slot(trace::Dtype dtype, const uint8_t* element, size_t size, uint64_t count) {
    // Allocated at the first fill: a thread_local array would not fit the static TLS block of a
    // preloaded library, and most threads never fill.
    if (slots_.empty()) slots_.resize(kSlots);
    uint64_t key = count * 0x9E3779B97F4A7C15ull ^ uint64_t(dtype);
    for (size_t i = 0; i < size; ++i) key = (key ^ element[i]) * 0x100000001B3ull;
    return slots_[size_t(key % kSlots)];
  }

  std::vector<Slot> slots_;
};

}  // namespace detaudit::hooks
