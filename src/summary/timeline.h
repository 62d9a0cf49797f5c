// A run on a timeline: the Chrome trace-event JSON that ui.perfetto.dev and chrome://tracing
// open. One lane per stream (rank and process, then thread), one slice per recorded op, nested
// as the ops were. Ops carry no clock, so time is program order: op k starts at k microseconds
// and ends after the ops nested in it.
//
//   std::ofstream out("run0.perfetto.json");
//   if (Status s = summary::write_timeline("audit/run-0", nullptr, out); !s.ok()) ...
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <string>

#include "util/status.h"

namespace detaudit::summary {

// What a diff marks on run A's timeline.
struct TimelineMarks {
  std::map<std::string, std::set<uint64_t>> divergent;    // stream -> program orders in run A
  std::optional<std::pair<std::string, uint64_t>> first;  // stream, order
  std::string first_label;                                // "nondeterministic-op at aten::..."
};

// A corrupt trace is a kBadInput error naming file and offset; a cut-short one ends its lane.
Status write_timeline(const std::string& run_dir, const TimelineMarks* marks, std::ostream& out);

}  // namespace detaudit::summary
