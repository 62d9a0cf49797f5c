// `run --validate`: is the verdict the program's, or the observer's? The program runs twice more
// with the interposer attached and no step recorded (the op path off), and each leaves its final
// parameters and optimizer state, hashed at exit (hooks/python/detaudit_final_state.py). A
// recorded IDENTICAL whose unrecorded runs differ means recording hid the divergence: a failed
// audit (exit 6), and the sentinel's pair, the cheapest observer, is tried to see if it shows it.
//
//   Validation v;  validate_unrecorded(config, options, report, on_run, &v);
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/config.h"
#include "diff/report_model.h"
#include "run/session.h"
#include "util/status.h"

namespace detaudit::run {

// Two final states (final-state.r<rank>.json of each run, by rank), compared; *v's compared,
// identical, tensors and difference set. A run with no state file, or no optimizer, is not
// compared, and `why` says so.
void compare_final_states(const std::vector<nlohmann::json>& a,
                          const std::vector<nlohmann::json>& b, Validation* v, std::string* why);

// Judges against the recorded verdict: hidden, failed and outcome.
void judge_validation(const DiffReport& recorded, const std::string& why, Validation* v);

using ValidateRunFn = std::function<void(const RunOutcome& outcome, int index)>;

// Records the two unrecorded runs into OUT/validate/run-0 and run-1, compares what they leave and
// judges it; when recording hid a divergence, the sentinel's two runs (OUT/validate/sentinel) are
// diffed too.
Status validate_unrecorded(const Config& config, const RunOptions& options,
                           const DiffReport& recorded, const ValidateRunFn& on_run, Validation* v);

}  // namespace detaudit::run
