// While a run records, what it costs: a long run recorded in full is said once, early, with its
// disk and time a step and a suggestion of --sentinel; a disk about to fill is said before it is.
// The launcher calls tick() while the program runs (launch_and_wait's poll loop).
//
//   RecordingWatch watch(config, "audit/run-0", 0);
//   spec.on_tick = [&] { watch.tick(); };
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "config/config.h"

namespace detaudit::run {

// What the run directory shows at one moment.
struct RecordingSample {
  double seconds = 0;       // since the watch began
  uint64_t step = 0;        // the furthest step any process is in (its .progress)
  bool any_step = false;    // some process said its step
  uint64_t bytes = 0;       // the run's stream files
  uint64_t free_bytes = 0;  // left on the filesystem that holds them
  bool free_known = false;
};

class RecordingWatch {
 public:
  // `say_cost`: this run's cost is said (a launcher says it for its first run only); `say`:
  // where the lines go (stderr by default).
  RecordingWatch(const Config& config, std::string run_dir, int run_index, bool say_cost = true,
                 std::function<void(const std::string&)> say = {});

  void tick();  // looks at most every 0.5 s: observe(sample())
  // What the run directory shows now, and the checks on one such sample.
  RecordingSample sample() const;
  void observe(const RecordingSample& s);

 private:
  void observe_disk(const RecordingSample& s, double bytes_a_step);

  std::string run_dir_;
  int run_index_ = 0;
  bool say_cost_ = true;
  int runs_ = 1;
  int64_t warn_after_steps_ = 0;
  bool full_ = false;  // every step recorded in full: no sentinel, no --steps
  std::function<void(const std::string&)> say_;
  std::chrono::steady_clock::time_point start_, last_look_;
  std::optional<RecordingSample> first_step_;  // the first sample with a step, for rates
  std::optional<RecordingSample> previous_;
  bool said_cost_ = false, said_disk_ = false;
};

}  // namespace detaudit::run
