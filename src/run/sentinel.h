// `run --sentinel`: from the diff of two sentinel runs (each step's parameters, gradients,
// optimizer state and loss), records the first divergent step and the one before it in full,
// twice, and makes their diff the report, the step-level finding kept in it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "config/config.h"
#include "diff/diff.h"
#include "diff/report_model.h"
#include "run/session.h"

namespace detaudit::run {

// The two sentinel runs being localised: how to record both again with some steps in full, and
// how to compare them. `run --sentinel`'s (sentinel_pair) record the program twice;
// `resume --sentinel`'s record it through and stopped and resumed.
struct SentinelPair {
  std::string out;  // the audit's directory, where the full recordings go
  // Records both runs with `steps` ("899-900") in full into `dir`; their run directories in
  // `dirs` (A, then B), or an error.
  std::function<Status(const std::string& steps, const std::string& dir,
                       std::vector<std::string>* dirs)>
      record_in_full;
  // The command that records both runs from step `from` on (said when the step-level finding
  // stands).
  std::function<std::string(uint64_t from)> command_from;
  DiffOptions diff;  // how they are compared (the gate, a resume step); the catalog is set here
};

// `run --sentinel`'s pair: the program recorded twice more into DIR/run-0 and DIR/run-1, the
// sentinel still watching every step.
SentinelPair sentinel_pair(const Config& config, const RunOptions& options);

// The steps a sentinel recorded in full: the steps of `steps`, in md5 unless a digest was
// chosen (the sentinel's default xxh3 only finds the step; these records are evidence).
Status recorded_in_full(const Config& sentinel, const std::string& steps, Config* full);

// `report` is the sentinel runs' diff; on return it is the report to render. `catalog_path`:
// the catalog whose ops the step-level finding lists when the full recording agrees.
void localize_divergent_step(const SentinelPair& pair, const std::string& catalog_path,
                             DiffReport* report);

}  // namespace detaudit::run
