// A diff split over machines. Each part compares the streams of a range of ranks
// (`detaudit diff A B --ranks 0-255 --part p0.json`) and keeps what the whole diff needs of
// them: each stream's own first divergence with its place among the collectives, the counts,
// and each rank's replica folds. The merge (`detaudit merge p0.json p1.json ...`) picks the first
// divergence among every part's, as the whole diff does, compares that one stream again for its
// evidence, checks the replicas over all ranks' folds and the worlds of the whole runs, and
// gives the verdict of the whole diff.
//
//   nlohmann::json part;  diff_part(a, b, options_with_ranks, &part);
//   DiffReport r;  merge_parts({part0, part1}, options, &r);
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "diff/diff.h"
#include "util/status.h"

namespace detaudit {

inline constexpr const char* kPartSchema = "detaudit.diff-part/1";

// `options.ranks` says which ranks; the rest of the options as for diff_runs.
Status diff_part(const std::string& run_a, const std::string& run_b, const DiffOptions& options,
                 nlohmann::json* part);

// Parts of one pair of runs whose ranks do not overlap; `sources` name them in errors. What the
// merged report lacks beside the whole diff's: the structural differences' and parameters'
// detail (their counts stay), the loss curve, how each process ended beyond its .status, and the
// worker and shared-memory tracing of the first divergence.
Status merge_parts(const std::vector<nlohmann::json>& parts,
                   const std::vector<std::string>& sources, const DiffOptions& options,
                   DiffReport* report);

}  // namespace detaudit
