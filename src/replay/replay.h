// `detaudit replay`: turns a verdict on one op into evidence. The op's inputs are captured from a
// new run of the recorded command (hooks/capture/op_capture.h), then the op is called again and again on
// them in a fresh process (hooks/capture/replay_main.cpp), and the distinct outputs are counted.
//
//   ReplayTarget t;  find_replay_target(run_dir, "r0.main.t-main", 51, &t);
//   ... run the command with DETAUDIT_CAPTURE=capture_spec_json(t, dir) ...
//   ReplayReport r;  r.target = t;  read_capture(dir, &r);  add_series(replayer_json, &r);
//   judge(&r);
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "util/status.h"

namespace detaudit::replay {

// One recorded op, as a capture finds it again.
struct ReplayTarget {
  std::string run_dir, stream, process, thread;
  uint64_t index = 0;  // among the stream's records, as the reports number ops
  std::string op;
  uint64_t occurrence = 0;  // among the thread's ops of that name, in start order
  uint64_t step = 0;
  std::string phase;
  std::vector<std::string> inputs;            // hex digests of its tensor inputs, "" if not read
  std::vector<std::string> recorded_outputs;  // hex digests of its tensor outputs
  std::string digest;                         // the run's algorithm ("md5")
  int intra_op_threads = 0;                   // the process's, from its environment fingerprint
  bool deterministic = false;                 // use_deterministic_algorithms, likewise
};

// Reads the op at `index` of `stream` in `run_dir`. An index past the stream's end or a stream
// that is not there is a usage error naming what exists.
Status find_replay_target(const std::string& run_dir, const std::string& stream, uint64_t index,
                          ReplayTarget* out);
// The process's intra-op threads and determinism flag, from its environment fingerprint; left
// as they are when it cannot be read.
void read_fingerprint(const std::string& run_dir, ReplayTarget* t);
// "STREAM:N" (as `--op` takes it).
Status parse_op_ref(const std::string& text, std::string* stream, uint64_t* index);

// The spec the interposer reads (DETAUDIT_CAPTURE); `dir` is where it saves.
nlohmann::json capture_spec_json(const ReplayTarget& t, const std::string& dir);

// The op called `replays` times under one setting.
struct ReplaySeries {
  std::string setting;  // "as recorded", "under contention", "under the remedy"
  int replays = 0, threads = 0;
  bool deterministic = false, busy_thread = false;
  int distinct = 0;
  double max_abs_diff = 0;
  double cores_used = 0;      // the op's CPU time over its wall time (0: not measured)
  int matching_recorded = 0;  // replays whose outputs are the recorded run's
  std::string error;          // the op refused (no deterministic implementation, ...)
};

struct ReplayReport {
  ReplayTarget target;
  std::string capture_status;  // saved | other-path | not-reached | unsupported | error
  std::string capture_why;
  int capture_runs = 0;  // new runs of the command it took (retried while on another path)
  std::string inputs_file;
  bool inputs_match = false;  // the saved inputs hash to the record's digests
  std::vector<ReplaySeries> series;
  // verified-nondeterministic | not-reproduced | unverified
  std::string evidence;
  std::string evidence_line;  // "reproduced: 7 distinct outputs in 20 replays (max |diff| 2.3e-10)"
  std::string remedy_line;    // "remedy verified in isolation: 20 of 20 identical (...)"
};

// The capture's outcome, from <dir>/capture.json (absent: the op was not reached).
void read_capture(const std::string& dir, ReplayReport* r);
// Worth another run: the program took another path, which a nondeterministic op before this one
// does on some runs and not others.
bool capture_may_succeed_again(const ReplayReport& r);
// One series from the replayer's JSON output; checks the inputs' digests against the record.
Status add_series(const std::string& setting, const nlohmann::json& replayer, ReplayReport* r);
// Sets evidence, evidence_line and remedy_line from the series.
void judge(ReplayReport* r);

nlohmann::json report_to_json(const ReplayReport& r);
std::string render_text(const ReplayReport& r);
std::string render_markdown(const ReplayReport& r);
// JUnit: an `evidence` case that fails when the op's nondeterminism is verified, and a `remedy`
// case that fails when the remedy did not make every replay identical.
std::string render_junit(const ReplayReport& r);
std::string render_html(const ReplayReport& r);  // self-contained

}  // namespace detaudit::replay
