// The generators' states at each step's start (STEP records), compared between two runs: the
// sentinel's third kind of evidence, beside parameters and the loss. A generator drawn once more
// or once less in one run (an extra random op, an unseeded reseed) shows here at the next step,
// even when no recorded tensor differs yet.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trace/records.h"
#include "util/status.h"

namespace detaudit {

struct GeneratorDifference {
  std::string stream;     // "r0.main.t-main"
  uint64_t step = 0;      // the first step whose starting state differs
  std::string generator;  // "cpu" or "cuda"
  uint64_t a = 0, b = 0;  // the states' digests
};

// Every STEP record of a stream, in its own numbering.
Status read_steps(const std::string& path, std::vector<trace::StepInfo>* steps);

// Compares the main threads' streams of each rank present in both runs; the earliest step over
// all of them, from each stream's second STEP record on (its first is taken before the program
// seeds). A missing or cut stream is compared as far as it goes.
Status first_generator_difference(const std::string& run_a, const std::string& run_b,
                                  std::optional<GeneratorDifference>* out);

}  // namespace detaudit
