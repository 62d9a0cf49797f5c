// A run recording every step in full says once what a step costs and suggests --sentinel; a disk
// about to fill is said before it does. Samples are given by the test; tick()'s reading of a
// run directory is tested on a real one.
#include "run/recording_watch.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "run_layout.h"
#include "test_files.h"

namespace detaudit::run {
namespace {

constexpr uint64_t kMB = 1000 * 1000;

Config full_recording(int64_t warn_after_steps) {
  Config c;
  c.runs = 2;
  c.warn_after_steps = warn_after_steps;
  return c;
}

RecordingSample at(double seconds, uint64_t step, uint64_t bytes, uint64_t free_bytes = 0) {
  RecordingSample s;
  s.seconds = seconds;
  s.step = step;
  s.any_step = true;
  s.bytes = bytes;
  s.free_bytes = free_bytes;
  s.free_known = free_bytes > 0;
  return s;
}

TEST(RecordingWatchTest, ALongFullRecordingSaysItsCostOnceWithTheSentinel) {
  std::vector<std::string> said;
  RecordingWatch w(full_recording(50), "audit/run-0", 0, true,
                   [&](const std::string& l) { said.push_back(l); });
  w.observe(at(0, 0, 0, 1000 * 1000 * kMB));
  w.observe(at(4, 40, 40 * kMB, 1000 * 1000 * kMB));
  EXPECT_TRUE(said.empty()) << "not before warn_after_steps";
  w.observe(at(5, 50, 50 * kMB, 1000 * 1000 * kMB));
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("run-0 has recorded 50 steps in full: 50.0 MB so far, 1.0 MB and "
                         "100.0 ms a step; 1,000 steps would take 1.0 GB and 100 s, in each of "
                         "the 2 runs"),
            std::string::npos)
      << said[0];
  EXPECT_NE(said[0].find("--sentinel"), std::string::npos);
  w.observe(at(10, 100, 100 * kMB, 1000 * 1000 * kMB));
  EXPECT_EQ(said.size(), 1u) << "once";
}

TEST(RecordingWatchTest, NothingIsSaidOfASentinelOrChosenSteps) {
  for (int which = 0; which < 3; ++which) {
    Config c = full_recording(which == 2 ? 0 : 10);
    if (which == 0) c.sentinel = true;
    if (which == 1) {
      ASSERT_TRUE(RangeSet::parse(nlohmann::json("0-3"), "steps", &c.select.steps).ok());
    }
    std::vector<std::string> said;
    RecordingWatch w(c, "audit/run-0", 0, true, [&](const std::string& l) { said.push_back(l); });
    for (uint64_t step = 0; step <= 100; step += 10)
      w.observe(at(double(step), step, step * kMB, 1000 * 1000 * kMB));
    EXPECT_TRUE(said.empty()) << which << ": " << (said.empty() ? "" : said[0]);
  }
}

TEST(RecordingWatchTest, ADiskAboutToFillIsSaidBeforeItDoes) {
  std::vector<std::string> said;
  // Even a sentinel run is told: any run can fill a disk.
  Config c = full_recording(0);
  c.sentinel = true;
  RecordingWatch w(c, "audit/run-0", 0, true, [&](const std::string& l) { said.push_back(l); });
  w.observe(at(0, 0, 0, 1000 * kMB));
  w.observe(at(10, 10, 10 * kMB, 990 * kMB));  // 1 MB/s: 990 s of room
  EXPECT_TRUE(said.empty());
  w.observe(at(20, 20, 110 * kMB, 90 * kMB));  // 10 MB/s: 9 s left
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("has 90.0 MB left and the run writes 10.0 MB/s: it fills in about 9 s "
                         "(16 more steps at 5.5 MB a step)"),
            std::string::npos)
      << said[0];
  EXPECT_NE(said[0].find("exit 5"), std::string::npos);
}

TEST(RecordingWatchTest, ReadsTheRunDirectorysProgressAndStreams) {
  namespace fs = std::filesystem;
  const std::string dir = detaudit::testing::fresh_temp_dir("recording_watch");
  fs::create_directories(fs::path(dir) / layout::kStreamsDir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(fs::path(dir) / layout::kStreamsDir / name) << text;
  };
  write("r0.main.progress", "step 00000000000000000007\n");
  write("r1.main.progress", "step 00000000000000000009\n");
  write("r0.main.t-main.dtr", std::string(1000, 'x'));
  write("r1.main.t-main.dtr", std::string(500, 'x'));
  write("r0.main.status", std::string(300, 'x'));
  const RecordingSample s = RecordingWatch(full_recording(3), dir, 1).sample();
  EXPECT_TRUE(s.any_step);
  EXPECT_EQ(s.step, 9u) << "the furthest process's step";
  EXPECT_EQ(s.bytes, 1500u) << "the traces only";
  EXPECT_TRUE(s.free_known);
  EXPECT_GT(s.free_bytes, 0u);
}

}  // namespace
}  // namespace detaudit::run
