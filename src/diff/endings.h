// How the processes of two runs ended: a program that failed, a rank that was killed, a library
// that aborted at teardown. From each run's run.json, each process's .status
// (trace/process_status.h) and the last record of each of its streams.
//
//   std::vector<RunEnding> e = collect_endings({&run_a, &run_b}, tails);
#pragma once

#include <map>
#include <string>
#include <vector>

#include "diff/report_model.h"
#include "trace/records.h"
#include "trace/run_directory.h"

namespace detaudit {

// The end of one stream of one run, as the comparator read it.
struct StreamTail {
  std::string stream;   // "r1.main.t-main"
  std::string process;  // "r1.main"
  int64_t rank = 0;
  bool ended = false;  // an END record, a crash's included
  bool any_op = false;
  std::string last_op;
  uint64_t last_step = 0, last_index = 0, last_order = 0;
};

// One RunEnding per run (run A, run B) whose program failed or whose processes did not all exit
// cleanly; empty when every process of both runs exited. `tails[0]` and `tails[1]`: the streams
// of run A and of run B.
std::vector<RunEnding> collect_endings(const std::vector<const trace::RunDirectory*>& runs,
                                       const std::vector<std::vector<StreamTail>>& tails);

// Whether `process` of a run stopped before its program's end: its .status says it was killed or
// interrupted before exiting, or says nothing of its end (SIGKILL). Its streams then stop where it
// did, whole or not. A crash while exiting (torch's teardown abort) came after the program's work.
bool process_stopped_early(const trace::RunDirectory& run, const std::string& process);

// One line for a process that did not exit cleanly: "r1.main killed by SIGABRT after its last
// recorded op (step 5, aten::add_, op #516 of r1.main.t-main), while exiting; its streams are
// whole".
std::string describe_ending(const ProcessEndingReport& p);

}  // namespace detaudit
