// What `detaudit replay` and `detaudit coverage` share: the recorded run found, its command run
// once more with a capture spec (hooks/capture/op_capture.h), and the replayer's environment.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/config.h"
#include "run/session.h"
#include "util/status.h"

namespace detaudit::cli {

struct CaptureRun {
  std::filesystem::path root;               // RUN as given
  bool audit = false;                       // RUN holds run-0, run-1, ...
  std::string run;                          // the run whose command runs again: RUN/run-0, or RUN
  Config config;                            // its config, set to run once into `out` with the spec
  run::RunOptions options;                  // its interposer, run quietly
  std::string out, capture_dir, spec_path;  // absolute
  std::string replayer;                     // detaudit_replay, beside the interposer
  std::vector<std::string> replayer_env;    // ours and the target's, without the interposer
  run::OutLock lock;
};

// RUN is an audit directory (run-0, run-1) or one run; a directory that is neither is exit 3.
Status find_recorded_run(const std::string& run_arg, CaptureRun* c);
// Reads the run's run.json and config, takes the lock on the audit (unless `take_lock` is false:
// the caller holds it), and empties `out_flag` (default RUN/<default_subdir>) as --force says.
Status prepare_capture_run(const std::string& out_flag, const std::string& default_subdir,
                           bool force, const std::string& verb, bool take_lock, CaptureRun* c);
// Writes the spec to <out>/capture-spec.json and points the run's command at it.
void set_capture_spec(const nlohmann::json& spec, CaptureRun* c);

}  // namespace detaudit::cli
