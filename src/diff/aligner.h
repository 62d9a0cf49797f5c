// Sequence alignment of two op streams by their keys: when the heads differ, find the nearest
// point (fewest ops skipped on both sides) where a run of keys matches again, inside a bounded
// look-ahead window.
#pragma once

#include <cstddef>
#include <optional>
#include <utility>

#include "diff/op_source.h"

namespace detaudit {

inline constexpr size_t kAlignWindow = 1024;  // ops of look-ahead per side
inline constexpr size_t kAlignRun = 4;        // matching keys needed to resynchronise

// (i, j): skip to a's op i and b's op j to resynchronise, from a's op from_a and b's from_b on;
// nullopt when the window holds none. Both sources must be filled first; a shorter run counts
// at the true end of a stream.
std::optional<std::pair<size_t, size_t>> find_resync(const OpSource& a, const OpSource& b,
                                                     size_t from_a = 0, size_t from_b = 0);

}  // namespace detaudit
