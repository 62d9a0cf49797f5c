// The diff's first phase: which streams of two runs are compared with which. Each run's trace
// streams by name (the ranks asked for only), the library pools' threads taken out to be
// compared as sets, run B's clashing thread names paired with run A's by what they ran, and
// what the comparison needs of each stream's header.
//
//   StreamSelection s;
//   if (Status st = select_streams(run_a, run_b, options.ranks, &s); !st.ok()) return st;
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "diff/library_threads.h"
#include "trace/run_directory.h"
#include "util/status.h"

namespace detaudit {

// What the diff needs from a stream's header before comparing it.
struct StreamHead {
  std::string process;  // "r0.main.0"
  bool dataloader_worker = false;
};

// The library pools' streams of one process, by (process, pool thread): run A's paths, run B's.
using PoolKey = std::pair<std::string, std::string>;

// How much of a stream pair is compared, when a run resumed from a checkpoint (resume.h): per
// run, its ops before first_step passed over, then `skip` more; its steps shifted by
// `step_shift` into the other run's numbering; or both runs' ops up to `until_step` only.
struct StreamWindow {
  uint64_t first_step[2] = {0, 0};
  uint64_t skip[2] = {0, 0};
  uint64_t step_shift[2] = {0, 0};
  std::optional<uint64_t> until_step;
  // A resumed stream's step and run (0 A, 1 B): op sequence differences at that step, and ops
  // the resumed run alone runs at the next (a fresh process's second iteration), are kept apart.
  std::optional<uint64_t> resume_step;
  int resumed_run = -1;
};

struct StreamSelection {
  // Stream name -> path, for run A and run B (run B's renamed to their partners' names).
  std::map<std::string, std::string> streams[2];
  std::map<PoolKey, PoolComparison> pools;
  std::map<PoolKey, std::pair<std::vector<std::string>, std::vector<std::string>>> pool_paths;
  // Every stream name of either run, with its head.
  std::map<std::string, StreamHead> heads;
  // The pairs a resume cuts, by stream name (resume.h); whole streams otherwise.
  std::map<std::string, StreamWindow> windows;
};

Status select_streams(const trace::RunDirectory& run_a, const trace::RunDirectory& run_b,
                      const RangeSet& ranks, StreamSelection* out);

// "r0.main" for a worker "r0.main.0": the process that forked it.
std::string parent_process(const std::string& process);

}  // namespace detaudit
