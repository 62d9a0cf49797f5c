// Bounded-window resynchronisation on runs of matching op keys.
#include "diff/aligner.h"

namespace detaudit {
namespace {

bool run_matches(const OpSource& a, size_t i, const OpSource& b, size_t j) {
  size_t na = a.size(), nb = b.size();
  size_t k = 0;
  for (; k < kAlignRun; ++k) {
    if (i + k >= na || j + k >= nb) break;
    if (a.at(i + k).key != b.at(j + k).key) return false;
  }
  if (k == kAlignRun) return true;
  // A short run is enough only where a stream really ends (not where the window does).
  bool a_end = i + k >= na && a.exhausted();
  bool b_end = j + k >= nb && b.exhausted();
  return k > 0 && (a_end || b_end);
}

}  // namespace

std::optional<std::pair<size_t, size_t>> find_resync(const OpSource& a, const OpSource& b,
                                                     size_t from_a, size_t from_b) {
  if (from_a >= a.size() || from_b >= b.size()) return std::nullopt;
  size_t na = a.size() - from_a, nb = b.size() - from_b;
  // Smallest total skip first; ties prefer skipping in b (an op inserted in run B).
  for (size_t cost = 1; cost < na + nb - 1; ++cost) {
    size_t i_min = cost >= nb ? cost - nb + 1 : 0;
    size_t i_max = cost < na ? cost : na - 1;
    for (size_t i = i_min; i <= i_max; ++i) {
      size_t j = cost - i;
      if (run_matches(a, from_a + i, b, from_b + j)) return std::make_pair(from_a + i, from_b + j);
    }
  }
  return std::nullopt;
}

}  // namespace detaudit
