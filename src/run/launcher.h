// Launches the audited program and supervises it: its stdout and stderr still reach ours and
// are copied to a log file, SIGINT/SIGTERM sent to us are passed on, and how it ended is kept.
//
//   LaunchSpec spec{{"/usr/bin/python3", "train.py"}, env, "", "run-0/output.log"};
//   LaunchResult result;
//   if (Status s = launch_and_wait(spec, &result); !s.ok()) ...  // could not start it
//   if (!result.succeeded()) ...                                  // it ran and failed
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "util/status.h"

namespace detaudit::run {

struct LaunchSpec {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH when it has no '/'
  std::vector<std::string> env;   // the whole environment, "K=V" each
  std::string cwd;                // empty: ours
  std::string log_path;           // the target's stdout and stderr, interleaved; empty: none
  bool echo = true;               // also copy its output to our stdout and stderr
  std::function<void()> on_tick;  // called about every 200 ms while it runs
};

struct LaunchResult {
  int exit_code = -1;  // when it exited
  int signal = 0;      // when a signal killed it
  double duration_s = 0;
  std::string start_time;  // UTC, ISO 8601
  bool succeeded() const { return signal == 0 && exit_code == 0; }
  std::string describe() const;  // "exit code 3", "killed by SIGSEGV"
};

// Runs the program to its end. An error means it could not be started (the message names the
// program and why); a program that ran and failed is a result, not an error.
Status launch_and_wait(const LaunchSpec& spec, LaunchResult* result);

// Runs a short helper program and returns its stdout (stderr is dropped). Used for probes that
// must not be audited (e.g. asking Python for its torch version).
Status capture_output(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                      const std::string& cwd, std::string* out, int* exit_code);

// The current process's environment as "K=V" strings.
std::vector<std::string> current_environment();

// The SIGINT or SIGTERM we received while supervising a program, or 0: the user wants to stop,
// so no further run should start.
int interrupted();

// "SIGSEGV" for SIGSEGV, "signal 42" for one without a name.
std::string signal_name(int sig);

}  // namespace detaudit::run
