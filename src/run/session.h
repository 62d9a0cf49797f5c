// One `detaudit run`: flags over the config, run directories, the audited program's environment,
// and run.json; src/run/interposer.h picks the interposer. The CLI file only parses and prints.
//
//   Config c;  load_config(path, &c);  apply_run_flags(flags, &c);  validate_for_run(c);
//   for (int i = 0; i < c.runs; ++i) execute_run(c, options, i, &outcome);
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "run/launcher.h"
#include "util/status.h"

namespace detaudit::run {

// `detaudit run` flags; each one set overrides the config field it names.
struct RunFlags {
  std::optional<int> runs;
  std::optional<std::string> out;
  std::optional<std::string> steps, ranks;              // "0-3,5,7-"
  std::optional<std::string> ops, exclude_ops, phases;  // comma-separated
  std::optional<std::string> digest;
  bool no_stats = false, no_inputs = false, rehash_inputs = false, allow_truncated = false;
  bool sentinel = false;
  bool no_mkl_vml_warm_up = false;
  std::optional<uint64_t> seed;
  std::optional<std::string> deterministic;  // on|warn|off
  std::optional<int> threads;
  std::optional<int> device_batch_mib;
  std::optional<std::string> format, output, fail_on;
  std::optional<double> rtol, atol, ulp;
  std::vector<std::string> env;  // K=V
  std::optional<std::string> cwd;
  std::vector<std::string> command;  // after "--"
};

// Applies the flags through the config parser, so flags and config share one set of checks;
// an error starts with the flag ("--steps: field \"select.steps[0]\": ...").
Status apply_run_flags(const RunFlags& flags, Config* config);

// What `run` needs beyond a valid config: a command.
Status validate_for_run(const Config& config);

// "<out>/run-<i>"
std::string run_dir_path(const Config& config, int index);
// The <i> of a directory named "run-<i>", as `run` names them; 0 for any other name.
int run_index(const std::string& dir);

// Creates the run directory. A non-empty existing one is refused unless `force`, which empties it
// first: traces of an earlier run must never mix with this one's.
Status prepare_run_dir(const std::string& dir, bool force);
// The same check without touching anything, so `run` can refuse before launching run-0.
Status check_run_dir(const std::string& dir, bool force);

// Holds <out>/.detaudit.lock while a `detaudit run` (or replay) writes into <out>: a second one
// into the same directory is refused at once (exit 2) rather than mixing its runs with ours. It
// also proves <out> can be created and written, before any program starts.
class OutLock {
 public:
  OutLock() = default;
  ~OutLock();
  OutLock(const OutLock&) = delete;
  OutLock& operator=(const OutLock&) = delete;
  // `what`: the verb that holds it, said to a second one ("detaudit run").
  Status acquire(const std::string& out, const std::string& what);

 private:
  int fd_ = -1;
};

// The audited program's environment: ours, then target.env, then the interposer's variables
// (LD_PRELOAD gets the preload shim prepended, DETAUDIT_INTERPOSER the hooks library it loads;
// a hooks library with no shim above it is preloaded itself).
// `node` names the launcher's part of a run recorded across nodes ("" for a whole run).
std::vector<std::string> target_environment(const Config& config, const std::string& hooks_library,
                                            const std::string& run_dir_abs,
                                            const std::string& node = "");

struct RunOutcome {
  std::string dir;  // absolute
  LaunchResult result;
  std::vector<std::string> streams;  // trace files found after the run, by name
  std::vector<std::pair<std::string, std::string>> statuses;  // process -> interposer status
  // Processes that did not exit cleanly: process -> how it ended, "" when its .status says
  // nothing (killed with no chance to say: SIGKILL).
  std::vector<std::pair<std::string, std::string>> endings;
};

struct RunOptions {
  std::string hooks_library;
  std::string version;  // detaudit's
  bool force = false;
  bool echo = true;  // the target's output also reaches our terminal
};

// Prepares run `index`, writes its config.json, runs the program and writes run.json. An error
// means the run could not happen; a program that failed is reported in the outcome.
Status execute_run(const Config& config, const RunOptions& options, int index, RunOutcome* outcome);

// One node's part of a run that launchers on several nodes write into (`detaudit record`): the
// directory is shared, so it is created if missing and never emptied; the node's manifest and
// config go under nodes/ (run_layout.h). A node name already there, or a whole run's run.json,
// is refused. The outcome's streams are those of the processes this node started.
Status execute_node_run(const Config& config, const RunOptions& options, const std::string& run_dir,
                        const std::string& node, RunOutcome* outcome);

// The node name a `detaudit record` takes unless given one: the host's name, with SLURM's task
// id under srun ("<host>.task<id>"), so that one task a rank leaves one manifest each.
std::string default_node_name();

// When the filesystem holding `dir` is (nearly) full: one line saying so, with the bytes left
// ("the disk holding audit/run-0 is full (0 bytes free)"); "" otherwise. A trace written there
// was cut where the disk refused it.
std::string full_disk_note(const std::string& dir);

// Trace files (streams/*.dtr) of a run directory, sorted by name.
std::vector<std::string> list_stream_files(const std::string& run_dir);
// streams/*.status of a run directory: (process, first line), sorted by process.
std::vector<std::pair<std::string, std::string>> read_stream_statuses(const std::string& run_dir);

}  // namespace detaudit::run
