// Whether a run holds every rank of its world. A run recorded across nodes (`detaudit record` on
// each) is whole only when each rank it should hold left a trace and each node's launcher
// finished; otherwise the comparison is incomplete, naming the ranks.
//
//   WorldCheck w;  check_world(run, environment, &w);
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "diff/report_model.h"
#include "trace/run_directory.h"
#include "util/status.h"

namespace detaudit {

// `environment`: the run's fingerprints by process (load_environment). The config the run was
// recorded with (config.json, or a node's) says which ranks were selected. Keeps `out->run`.
Status check_world(const trace::RunDirectory& run,
                   const std::map<std::string, std::map<std::string, std::string>>& environment,
                   WorldCheck* out);

// Both runs recorded alike: a sentinel run (each step's end only) is compared with a sentinel
// run, not with a full recording. A usage error naming both otherwise; runs without a config
// pass. *sentinel: both are sentinel runs.
Status check_recorded_alike(const trace::RunDirectory& a, const trace::RunDirectory& b,
                            bool* sentinel);

inline bool lost_world(const WorldCheck& check) {
  return !check.missing.empty() || !check.unfinished.empty();
}

// Lines for the report's "not compared": "run B: ranks 2, 3 of 4 left no trace ...".
std::vector<std::string> describe_world(const WorldCheck& check);

// "r0.main ran on n0 in run A, on n1 in run B (and 3 more)": where ranks ran is no cause, so
// it is one note rather than a difference per process; "" when every process stayed put.
std::string placement_note(const std::map<std::string, std::map<std::string, std::string>>& a,
                           const std::map<std::string, std::map<std::string, std::string>>& b);

}  // namespace detaudit
