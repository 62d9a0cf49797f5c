// Work cut into groups that end together: each item, taken largest first, goes to the group
// with the least work so far (the MD5 batch's leaves, the sentinel's state record's tensors).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

namespace detaudit {

// group_of[k] for the k-th item of an order by weight, largest first; `groups` <= kMaxGroups.
template <size_t kMaxGroups, class WeightOfKth>
void balance_groups(size_t items, size_t groups, const WeightOfKth& weight_of_kth,
                    uint8_t* group_of) {
  static_assert(kMaxGroups <= 256, "a group's number is a byte");
  std::array<uint64_t, kMaxGroups> load{};
  for (size_t k = 0; k < items; ++k) {
    const size_t g = size_t(std::min_element(load.begin(), load.begin() + groups) - load.begin());
    group_of[k] = uint8_t(g);
    load[g] += uint64_t(weight_of_kth(k));
  }
}

}  // namespace detaudit
