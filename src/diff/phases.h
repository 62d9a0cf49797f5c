// The phases diff_runs and merge_parts (partial.h) share. The diff runs, in the order the data
// flows:
//   select streams (stream_selection.h) -> environment and world -> align and compare
//   (comparator.h) -> replicas -> first divergence -> spread -> causes (first_divergence.h,
//   classify.h) -> verdict
// A merge takes the compared results from its parts and runs the same phases around them.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "diff/endings.h"
#include "diff/replicas.h"
#include "diff/report_model.h"
#include "trace/run_directory.h"
#include "util/status.h"

namespace detaudit {

// A run's environment fingerprints by process, flattened (load_environment).
using Fingerprints = std::map<std::string, std::map<std::string, std::string>>;

// Each run's fingerprints into `fingerprints`; their differences, the placement note and both
// runs' worlds into the report.
Status check_environment_and_world(const trace::RunDirectory& run_a,
                                   const trace::RunDirectory& run_b, DiffReport* r,
                                   Fingerprints fingerprints[2]);

// Whether each run's data-parallel replicas held the same parameters at every step, from the
// folds read while comparing. A part keeps its folds for the merge, which checks them all.
Status check_replicas_of_both(const trace::RunDirectory& run_a, const trace::RunDirectory& run_b,
                              std::vector<RankFolds> folds[2], bool part, DiffReport* r);

// The first divergence's why: its tensors' roles from run A's trace of its stream (`trace_a`,
// null if that trace is not in the selection), its class under the runs' torch builds, then its
// cause and remedy.
Status explain_first(const std::string* trace_a, const std::vector<EnvDifference>& environment,
                     FirstDivergence* first);

// After the resumes are explained: a first divergence that reaches no training state, where
// the training state was compared and agrees, says so in its cause.
void note_training_identical(DiffReport* r);

// The last phase: what was not compared because a world was lost (not for a part: its merge
// says it), how each run ended, and the verdict. The caller says why, when it is "unexplained".
void finish_report(const trace::RunDirectory& run_a, const trace::RunDirectory& run_b,
                   const std::vector<std::vector<StreamTail>>& tails, bool part, DiffReport* r);

}  // namespace detaudit
