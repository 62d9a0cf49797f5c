// A recorded process's .status file (run_layout.h): what the interposer says of the process, in
// lines, and last of all how it ended. Written by hooks/, read by `run`, `show` and the diff.
//
//   <status>  ::= <attached-line> "\n" <line "\n">* [<ending> "\n"]
//   <ending>  ::= "ended: " <how> (" | " <detail>)*
//   <how>     ::= "exit" | "killed by " <signal> | "interrupted by " <signal>
//   <detail>  ::= "thread " <name>              ; the thread the signal stopped
//               | "after its last recorded op"  ; no op of that thread was open
//               | "inside " <op> " (step " <n> ")"  ; that op started and never ended
//               | "while exiting"               ; exit had begun (Python finalizing, atexit)
//
// No ending line: the process was killed without a chance to say so (SIGKILL, the OOM killer, a
// lost node), or is still running.
//
//   ProcessEnding e;  parse_ending("ended: killed by SIGABRT | after its last recorded op", &e);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace detaudit::trace {

struct ProcessEnding {
  enum class How { kExit, kKilled, kInterrupted };
  How how = How::kExit;
  std::string signal;     // "SIGABRT", for kKilled and kInterrupted
  std::string thread;     // the thread the signal stopped, "" if it recorded nothing
  std::string inside_op;  // the op it was inside, "" when after its last recorded op
  uint64_t inside_step = 0;
  bool exiting = false;

  bool clean() const { return how == How::kExit; }
  // "killed by SIGABRT", "interrupted by SIGTERM", "exit"
  std::string how_text() const;
  // The line the interposer writes.
  std::string line() const;
  // For a report: "killed by SIGABRT on thread pt_gloo_runloop after its last recorded op, while
  // exiting".
  std::string describe() const;
};

// "SIGABRT" for 6: the name an ending line and a signal's END record give.
std::string signal_text(int sig);

// Parses an ending line; false when `line` is not one.
bool parse_ending(std::string_view line, ProcessEnding* out);

struct ProcessStatus {
  std::string first_line;  // "attached libtorch 2.13.0 pid 123 ...", or why it did not record
  std::vector<std::string> lines;
  std::optional<ProcessEnding> ending;
};

// Reads a .status file; false when it cannot be read.
bool read_process_status(const std::string& path, ProcessStatus* out);

}  // namespace detaudit::trace
