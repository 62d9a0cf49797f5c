// A run's world (src/diff/world.h): the ranks it should hold, the nodes that never finished, and
// where ranks ran, which is no cause.
#include "diff/world.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "diff/environment.h"
#include "test_files.h"
#include "trace/run_directory.h"

namespace detaudit {
namespace {

namespace fs = std::filesystem;
using testing::fresh_temp_dir;
using Environment = std::map<std::string, std::map<std::string, std::string>>;

std::map<std::string, std::string> rank_env(int rank, int world, const std::string& node,
                                            const std::string& host = "vm") {
  return {{"rank", std::to_string(rank)},
          {"world_size", std::to_string(world)},
          {"node", node},
          {"host", host},
          {"process_role", "main"}};
}

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

TEST(WorldTest, RanksOfTheWorldWithNoTraceAreMissing) {
  const std::string dir = fresh_temp_dir("world_missing");
  Environment env = {{"r0.main", rank_env(0, 4, "n0")},
                     {"r1.main", rank_env(1, 4, "n0")},
                     {"r3.main", rank_env(3, 4, "n1")},
                     {"r0.main.0", rank_env(0, 4, "n0")}};  // a worker of rank 0
  WorldCheck w;
  w.run = "B";
  ASSERT_TRUE(check_world(trace::RunDirectory::list(dir), env, &w).ok());
  EXPECT_EQ(w.world_size, 4);
  EXPECT_EQ(w.missing, std::vector<int64_t>{2});
  EXPECT_TRUE(lost_world(w));
  const std::vector<std::string> lines = describe_world(w);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind("run B: rank 2 of a world of 4 left no trace", 0), 0u) << lines[0];

  // Ranks the config did not select were never to be recorded.
  write(fs::path(dir) / "config.json", R"({"select": {"ranks": ["0-1", 3]}})");
  ASSERT_TRUE(check_world(trace::RunDirectory::list(dir), env, &w).ok());
  EXPECT_TRUE(w.missing.empty());
  EXPECT_FALSE(lost_world(w));
}

TEST(WorldTest, ANodeWhoseLauncherNeverFinishedIsNamedWithItsRanks) {
  const std::string dir = fresh_temp_dir("world_nodes");
  write(fs::path(dir) / "nodes" / "n0.json", R"({"node": "n0", "finished": true})");
  write(fs::path(dir) / "nodes" / "n0.config.json", "{}");
  write(fs::path(dir) / "nodes" / "n1.json", R"({"node": "n1", "finished": false})");
  Environment env = {{"r0.main", rank_env(0, 4, "n0")},
                     {"r1.main", rank_env(1, 4, "n0")},
                     {"r2.main", rank_env(2, 4, "n1")},
                     {"r3.main", rank_env(3, 4, "n1")}};
  WorldCheck w;
  w.run = "A";
  ASSERT_TRUE(check_world(trace::RunDirectory::list(dir), env, &w).ok());
  EXPECT_TRUE(w.missing.empty());
  EXPECT_EQ(w.unfinished, std::vector<std::string>{"n1 (ranks 2, 3)"});
  ASSERT_EQ(describe_world(w).size(), 1u);
  EXPECT_NE(describe_world(w)[0].find("node n1 (ranks 2, 3) never finished"), std::string::npos);

  write(fs::path(dir) / "nodes" / "n1.json", "{\"node\": ");  // cut mid-write
  Status s = check_world(trace::RunDirectory::list(dir), env, &w);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ExitCode::kBadInput);
  EXPECT_NE(s.message().find("n1.json"), std::string::npos) << s.message();
}

TEST(WorldTest, WhereRanksRanIsOneNoteAndNoEnvironmentDifference) {
  Environment a = {{"r0.main", rank_env(0, 2, "null", "host-a")},
                   {"r1.main", rank_env(1, 2, "null", "host-b")}};
  Environment b = {{"r0.main", rank_env(0, 2, "null", "host-c")},
                   {"r1.main", rank_env(1, 2, "null", "host-b")}};
  EXPECT_EQ(placement_note(a, a), "");
  EXPECT_EQ(placement_note(a, b),
            "placement: r0.main ran on host-a in run A, on host-c in run B; where a rank runs is "
            "not a cause, and not compared");
  EXPECT_TRUE(diff_environment(a, "", b, "").empty());
}

TEST(EnvironmentTest, TheRunsDirectoryIsMaskedAsAPathNotAsLetters) {
  // Runs named A and B: their names are in "oneAPI" and "Build", not only in their paths.
  std::map<std::string, std::map<std::string, std::string>> a, b;
  a["r0.main"]["build_config"] = "Intel(R) oneAPI Math Kernel Library, Build A settings";
  b["r0.main"]["build_config"] = "Intel(R) oneAPI Math Kernel Library, Build A settings";
  a["r0.main"]["command_line"] = "[\"train.py\",\"--out\",\"A/ck\"]";
  b["r0.main"]["command_line"] = "[\"train.py\",\"--out\",\"B/ck\"]";
  EXPECT_TRUE(diff_environment(a, "A", b, "B").empty());
  b["r0.main"]["command_line"] = "[\"train.py\",\"--out\",\"AB/ck\"]";
  const auto d = diff_environment(a, "A", b, "B");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].a, "[\"train.py\",\"--out\",\"<run>/ck\"]");
  EXPECT_EQ(d[0].b, "[\"train.py\",\"--out\",\"AB/ck\"]");
}

}  // namespace
}  // namespace detaudit
