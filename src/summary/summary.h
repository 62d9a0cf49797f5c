// What `detaudit show` and `detaudit export` read from a run directory, one record at a time:
// memory stays bounded by the number of distinct op names, not by the length of the trace.
//
//   RunSummary s;
//   if (Status st = summarize_run("audit/run-0", "", &s); !st.ok()) ...  // corrupt: kBadInput
//   for (const StreamSummary& stream : s.streams) ...
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "trace/reader.h"
#include "util/status.h"

namespace detaudit::summary {

struct StreamSummary {
  std::string name;  // "r0.main.t0"
  std::string path;
  trace::StreamHeader header;
  uint64_t ops = 0;
  uint64_t phase_ops[4] = {};  // by trace::Phase
  std::map<std::string, uint64_t> op_counts;
  uint64_t step_records = 0;
  uint64_t first_step = 0, last_step = 0;
  bool saw_end = false;
  trace::EndInfo end;
  bool cut_short = false;  // the writer was killed: no END record
  std::string cut_reason;  // "<file>: offset N: ..." when the file ends inside a record
  uint64_t bytes = 0;      // file size
};

struct RunSummary {
  std::string dir;
  nlohmann::json run_json;  // null when the run has no run.json
  std::vector<StreamSummary> streams;
  std::vector<std::pair<std::string, std::string>> statuses;  // process -> interposer status
};

// The trace files of a run directory in name order, as (stream name, path). `stream` keeps one
// ("r0.main.t0" or "r0.main.t0.dtr"); an unknown name is an error listing the known ones.
Status find_streams(const std::string& run_dir, const std::string& stream,
                    std::vector<std::pair<std::string, std::string>>* out);

// Reads every stream once. A corrupt trace stops it with a kBadInput error naming file and offset.
Status summarize_run(const std::string& run_dir, const std::string& stream, RunSummary* out);

// The N most frequent ops over all streams, most frequent first (ties by name).
std::vector<std::pair<std::string, uint64_t>> top_ops(const RunSummary& s, size_t n);

// One op of a step, for `show --step`.
struct OpLine {
  uint64_t order = 0;
  uint32_t depth = 0;
  std::string name;
  trace::Phase phase = trace::Phase::kForward;
  std::string digest_prefix;  // of the first output tensor; empty if none
  std::vector<int64_t> shape;
};

// Calls `fn` for each op of `step` in one stream's file order.
Status for_each_step_op(const std::string& trace_path, uint64_t step,
                        const std::function<void(const OpLine&)>& fn);

// The value of a decoded argument list as JSON, tensors as objects. Exposed for tests.
nlohmann::json values_to_json(const trace::TraceReader& r, const std::vector<trace::Value>& values);

// Writes every record of the selected streams as JSON Lines. Returns a kBadInput error naming
// file and offset at the first corrupt record, after writing all that came before it.
// `notes` gets one line per stream that was cut short.
Status export_run(const std::string& run_dir, const std::string& stream, std::ostream& out,
                  std::vector<std::string>* notes);

}  // namespace detaudit::summary
