// Errors as values: core functions return Status; the CLI maps them to exit codes once.
#pragma once

#include <string>
#include <utility>

namespace detaudit {

// The documented exit codes (docs/exit-codes.md).
enum class ExitCode : int {
  kIdentical = 0,
  kDivergent = 1,
  kUsage = 2,         // bad flags or config
  kBadInput = 3,      // unreadable or corrupt trace or run directory
  kTargetFailed = 4,  // the audited program failed (nonzero exit or signal) in some run
  kIncomplete = 5,    // no divergence seen, but part of a run was not compared (a cut stream)
  kUnexplained = 6,   // ops diverged but no first divergence could be named: detaudit's fault
  kNotCaptured = 7,   // replay: the op was not reached again, or its inputs could not be saved
  kNoVerdict = 8      // nothing diverged, but too little was seen to pass (DiffReport::no_verdict)
};

class Status {
 public:
  Status() = default;
  static Status error(std::string message, ExitCode code = ExitCode::kUsage) {
    Status s;
    s.ok_ = false;
    s.message_ = std::move(message);
    s.code_ = code;
    return s;
  }
  bool ok() const { return ok_; }
  const std::string& message() const { return message_; }
  ExitCode code() const { return code_; }

 private:
  bool ok_ = true;
  std::string message_;
  ExitCode code_ = ExitCode::kIdentical;
};

}  // namespace detaudit
