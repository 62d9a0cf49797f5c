// Where two runs ran other ops for the same computation (a refactor: nn.Linear's addmm against
// `x @ W.t() + b`; a decomposition that changed between torch builds), the aligner skips a
// region of each side. The region is matched by the values it hands on: those its ops made
// that an op after it reads.
#pragma once

#include <cstddef>
#include <string>

#include "config/config.h"
#include "diff/op_source.h"
#include "diff/report_model.h"

namespace detaudit {

// Regions longer than this (ops a side) are not matched: another program, not a refactor (a
// compiled step's first region holds its compilation's ops too, 1,422 in the numerics matrix's
// MLP), and the matching is quadratic in a region's values.
inline constexpr size_t kMaxMatchedRegion = 2048;

// Run A's first n buffered ops against run B's first m, each side's later buffered ops being
// what reads their values.
RegionValues match_region_values(const OpSource& a, size_t n, const OpSource& b, size_t m,
                                 const GateConfig& gate);

// A region of other ops: run A's first n buffered ops against run B's first m, matched by the
// values they hand on, in `stretches` stretches of other ops with the ops both runs ran between
// them (autograd runs a refactor's gradients in another order: nn.Linear's AddmmBackward0
// before the bias's sum, `x @ W.t() + b`'s AddBackward0 after it).
struct MatchedRegion {
  size_t n = 0, m = 0;
  RegionValues values;
  size_t stretches = 1;
};

// The region of run A's first n ops against run B's first m (where the aligner resynchronised);
// while some value it hands on has no counterpart within the tolerance in the other run's
// region, widened over the next stretches of other ops in the same step and phase, up to
// kMaxWidenedStretches, and in the backward over up to kMaxAbsorbedOps of the ops both ran
// after each (a refactor's gradients summed in another order), to the first whose every value has a
// counterpart within the tolerance; else as the aligner found it.
inline constexpr size_t kMaxWidenedStretches = 4;
inline constexpr size_t kMaxAbsorbedOps = 8;
MatchedRegion match_region(const OpSource& a, size_t n, const OpSource& b, size_t m,
                           const GateConfig& gate);

// How many values side s's first n ops make that an op after them (in the buffer) reads: for
// ops only one run ran, whose effect the ops after them show.
uint64_t values_read_after(const OpSource& s, size_t n);

// "the 5 values it hands on agree bit for bit", for a structural difference's detail.
std::string region_values_text(const RegionValues& v);

}  // namespace detaudit
