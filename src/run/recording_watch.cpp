#include "run/recording_watch.h"

#include <fmt/format.h>
#include <sys/statvfs.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "run_layout.h"
#include "util/units.h"

namespace detaudit::run {
namespace fs = std::filesystem;

namespace {

constexpr auto kLookEvery = std::chrono::milliseconds(500);
// A disk this close to full (at the rate the run writes) is said before it fills.
constexpr double kDiskWarnSeconds = 120;
// Rates come from at least this many steps past the first one seen.
constexpr uint64_t kStepsForRate = 5;

bool ends_with(const std::string& s, const char* suffix) {
  const std::string t(suffix);
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

}  // namespace

RecordingWatch::RecordingWatch(const Config& config, std::string run_dir, int run_index,
                               bool say_cost, std::function<void(const std::string&)> say)
    : run_dir_(std::move(run_dir)),
      run_index_(run_index),
      say_cost_(say_cost),
      runs_(config.runs),
      warn_after_steps_(config.warn_after_steps),
      full_(!config.sentinel && config.select.steps.all()),
      say_(say ? std::move(say)
               : [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); }),
      start_(std::chrono::steady_clock::now()),
      last_look_(start_) {}

void RecordingWatch::tick() {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_look_ < kLookEvery || (said_cost_ && said_disk_)) return;
  last_look_ = now;
  observe(sample());
}

RecordingSample RecordingWatch::sample() const {
  RecordingSample s;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const fs::path streams = fs::path(run_dir_) / layout::kStreamsDir;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(streams, ec)) {
    const std::string name = e.path().filename().string();
    if (ends_with(name, layout::kTraceExt)) {
      s.bytes += e.file_size(ec);
    } else if (ends_with(name, layout::kProgressExt)) {
      std::ifstream in(e.path());
      std::string word;
      unsigned long long step = 0;
      if (in >> word >> step && word == "step") {
        s.step = std::max<uint64_t>(s.step, step);
        s.any_step = true;
      }
    }
  }
  struct statvfs v {};
  if (::statvfs(streams.c_str(), &v) == 0) {
    s.free_bytes = uint64_t(v.f_bavail) * v.f_frsize;
    s.free_known = true;
  }
  return s;
}

void RecordingWatch::observe(const RecordingSample& s) {
  if (s.any_step && !first_step_) first_step_ = s;
  const bool rates = first_step_ && s.step >= first_step_->step + kStepsForRate;
  const uint64_t steps = rates ? s.step - first_step_->step : 0;
  const double bytes_a_step = rates ? double(s.bytes - first_step_->bytes) / double(steps) : 0;
  const double seconds_a_step = rates ? (s.seconds - first_step_->seconds) / double(steps) : 0;

  if (!said_cost_ && say_cost_ && full_ && warn_after_steps_ > 0 && rates &&
      s.step >= uint64_t(warn_after_steps_)) {
    said_cost_ = true;
    say_(fmt::format(
        "detaudit: run-{} has recorded {} steps in full: {} so far, {} and {} a step; "
        "1,000 steps would take {} and {}{}. For a long run, --sentinel records each step's "
        "end only (about the program's own speed), then the step that differs in full; --steps "
        "picks the steps to record (record.warn_after_steps: when this is said)",
        run_index_, s.step, human_bytes(s.bytes), human_bytes(uint64_t(bytes_a_step)),
        seconds_a_step < 1 ? fmt::format("{:.1f} ms", seconds_a_step * 1000)
                           : fmt::format("{:.2f} s", seconds_a_step),
        human_bytes(uint64_t(bytes_a_step * 1000)), human_seconds(seconds_a_step * 1000),
        runs_ > 1 ? fmt::format(", in each of the {} runs", runs_) : ""));
  }

  observe_disk(s, bytes_a_step);
}

// The rate it writes at now, over the last look: a disk that fills within minutes is said.
void RecordingWatch::observe_disk(const RecordingSample& s, double bytes_a_step) {
  if (!said_disk_ && s.free_known && previous_ && s.seconds > previous_->seconds &&
      s.bytes > previous_->bytes) {
    const double rate = double(s.bytes - previous_->bytes) / (s.seconds - previous_->seconds);
    const double fills_in = double(s.free_bytes) / rate;
    if (fills_in < kDiskWarnSeconds) {
      said_disk_ = true;
      say_(fmt::format(
          "detaudit: the filesystem holding {} has {} left and the run writes {}/s: it fills "
          "in about {}{}. A full disk cuts the trace there (what was recorded is kept, and the "
          "diff says incomplete, exit 5); free space, or record less (--sentinel, --steps)",
          run_dir_, human_bytes(s.free_bytes), human_bytes(uint64_t(rate)), human_seconds(fills_in),
          bytes_a_step > 0 ? fmt::format(" ({} more steps at {} a step)",
                                         uint64_t(double(s.free_bytes) / bytes_a_step),
                                         human_bytes(uint64_t(bytes_a_step)))
                           : ""));
    }
  }
  previous_ = s;
}

}  // namespace detaudit::run
