#include "trace/process_status.h"

#include <cstdlib>
#include <cstring>
#include <fstream>

namespace detaudit::trace {
namespace {

constexpr std::string_view kEnded = "ended: ";
constexpr std::string_view kSeparator = " | ";
constexpr std::string_view kKilled = "killed by ";
constexpr std::string_view kInterrupted = "interrupted by ";
constexpr std::string_view kThread = "thread ";
constexpr std::string_view kAfterLast = "after its last recorded op";
constexpr std::string_view kInside = "inside ";
constexpr std::string_view kExiting = "while exiting";

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

}  // namespace

std::string signal_text(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string ProcessEnding::how_text() const {
  switch (how) {
    case How::kExit: return "exit";
    case How::kKilled: return std::string(kKilled) + signal;
    case How::kInterrupted: return std::string(kInterrupted) + signal;
  }
  return "exit";
}

std::string ProcessEnding::line() const {
  std::string out = std::string(kEnded) + how_text();
  if (how == How::kExit) return out;
  if (!thread.empty()) out += std::string(kSeparator) + std::string(kThread) + thread;
  out += std::string(kSeparator);
  out += inside_op.empty()
             ? std::string(kAfterLast)
             : std::string(kInside) + inside_op + " (step " + std::to_string(inside_step) + ")";
  if (exiting) out += std::string(kSeparator) + std::string(kExiting);
  return out;
}

std::string ProcessEnding::describe() const {
  if (how == How::kExit) return "exited";
  std::string out = how_text();
  out += thread.empty() ? " on a thread that recorded nothing" : " on thread " + thread;
  out += inside_op.empty() ? " after its last recorded op"
                           : " inside " + inside_op + " (step " + std::to_string(inside_step) +
                                 "), which never finished";
  if (exiting) out += ", while exiting";
  return out;
}

bool parse_ending(std::string_view line, ProcessEnding* out) {
  if (!starts_with(line, kEnded)) return false;
  line.remove_prefix(kEnded.size());
  ProcessEnding e;
  bool first = true;
  while (!line.empty() || first) {
    const size_t cut = line.find(kSeparator);
    std::string_view part = line.substr(0, cut);
    line = cut == std::string_view::npos ? std::string_view()
                                         : line.substr(cut + kSeparator.size());
    if (first) {
      first = false;
      if (part == "exit") {
        e.how = ProcessEnding::How::kExit;
      } else if (starts_with(part, kKilled)) {
        e.how = ProcessEnding::How::kKilled;
        e.signal = part.substr(kKilled.size());
      } else if (starts_with(part, kInterrupted)) {
        e.how = ProcessEnding::How::kInterrupted;
        e.signal = part.substr(kInterrupted.size());
      } else {
        return false;
      }
      continue;
    }
    if (starts_with(part, kThread)) {
      e.thread = part.substr(kThread.size());
    } else if (part == kExiting) {
      e.exiting = true;
    } else if (starts_with(part, kInside)) {
      part.remove_prefix(kInside.size());
      const size_t step_at = part.rfind(" (step ");
      if (step_at == std::string_view::npos) {
        e.inside_op = part;
      } else {
        e.inside_op = part.substr(0, step_at);
        e.inside_step = std::strtoull(std::string(part.substr(step_at + 7)).c_str(), nullptr, 10);
      }
    }  // "after its last recorded op", and details a later detaudit adds, change nothing here
  }
  *out = std::move(e);
  return true;
}

bool read_process_status(const std::string& path, ProcessStatus* out) {
  std::ifstream in(path);
  if (!in) return false;
  ProcessStatus s;
  std::string line;
  bool first = true;
  while (std::getline(in, line)) {
    if (first) {
      s.first_line = line;
      first = false;
      continue;
    }
    ProcessEnding e;
    if (parse_ending(line, &e)) s.ending = e;  // the last one counts
    s.lines.push_back(line);
  }
  *out = std::move(s);
  return true;
}

}  // namespace detaudit::trace
