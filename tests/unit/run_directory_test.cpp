// A run directory listed once: its files by kind and name, and one error for each way a path is
// not a run.
#include "trace/run_directory.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace detaudit::trace {
namespace {
namespace fs = std::filesystem;

class RunDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("detaudit_run_directory_" +
            std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& relative, const std::string& text = "") {
    fs::create_directories((dir_ / relative).parent_path());
    std::ofstream(dir_ / relative) << text;
  }
  static std::vector<std::string> names(const std::vector<RunFile>& files) {
    std::vector<std::string> out;
    for (const RunFile& f : files) out.push_back(f.name);
    return out;
  }
  fs::path dir_;
};

TEST_F(RunDirectoryTest, ListsEachKindByNameAndLeavesTheRest) {
  write("streams/r1.main.t-main.dtr");
  write("streams/r0.main.t-main.dtr");
  write("streams/r0.main.0.t-main.dtr");
  write("streams/r0.main.status", "attached\n");
  write("streams/r0.main.env.json", "{}");
  write("streams/notes.txt");
  write("streams/.dtr");  // no name: not a stream
  RunDirectory run;
  ASSERT_TRUE(RunDirectory::open(dir_.string(), &run).ok());
  EXPECT_EQ(names(run.traces()),
            (std::vector<std::string>{"r0.main.0.t-main", "r0.main.t-main", "r1.main.t-main"}));
  EXPECT_EQ(names(run.statuses()), std::vector<std::string>{"r0.main"});
  EXPECT_EQ(names(run.environments()), std::vector<std::string>{"r0.main"});
  EXPECT_EQ(run.traces()[0].path, (dir_ / "streams" / "r0.main.0.t-main.dtr").string());
  ASSERT_NE(run.trace("r1.main.t-main"), nullptr);
  EXPECT_EQ(run.trace("r1.main.t-main")->path, (dir_ / "streams" / "r1.main.t-main.dtr").string());
  EXPECT_EQ(run.trace("r2.main.t-main"), nullptr);
  EXPECT_TRUE(run.require_traces().ok());
  ASSERT_NE(run.status("r0.main"), nullptr);
  EXPECT_EQ(run.status("r1.main"), nullptr);
  EXPECT_TRUE(run.node_manifests().empty());  // a run of `detaudit run`: no nodes/
}

TEST_F(RunDirectoryTest, NodesManifestsAndConfigsAreListedApartByNode) {
  write("streams/r0.main.t-main.dtr");
  write("nodes/n1.json", "{}");
  write("nodes/n0.json", "{}");
  write("nodes/n0.config.json", "{}");
  write("nodes/n0.log");  // the launcher's output: neither
  RunDirectory run;
  ASSERT_TRUE(RunDirectory::open(dir_.string(), &run).ok());
  EXPECT_EQ(names(run.node_manifests()), (std::vector<std::string>{"n0", "n1"}));
  EXPECT_EQ(names(run.node_configs()), std::vector<std::string>{"n0"});
  EXPECT_EQ(run.node_configs()[0].path, (dir_ / "nodes" / "n0.config.json").string());
  EXPECT_EQ(run.run_manifest(), dir_.string() + "/run.json");
}

TEST_F(RunDirectoryTest, EachWayOfNotBeingARunIsOneErrorNamingThePath) {
  RunDirectory run;
  Status missing = RunDirectory::open((dir_ / "nowhere").string(), &run);
  EXPECT_EQ(missing.code(), ExitCode::kBadInput);
  EXPECT_EQ(missing.message(), (dir_ / "nowhere").string() + ": no such run directory");
  write("file");
  Status file = RunDirectory::open((dir_ / "file").string(), &run);
  EXPECT_EQ(file.message(), (dir_ / "file").string() + ": not a directory");
  Status no_streams = RunDirectory::open(dir_.string(), &run);
  EXPECT_EQ(no_streams.code(), ExitCode::kBadInput);
  EXPECT_EQ(no_streams.message(), dir_.string() + ": not a run directory (no streams/)");
  // list() takes what is there, without a word.
  EXPECT_TRUE(RunDirectory::list((dir_ / "nowhere").string()).traces().empty());
}

TEST_F(RunDirectoryTest, NoStreamRecordedIsAnErrorQuotingWhy) {
  write("streams/r0.main.status", "not attached: torch 2.9 has no interposer here\nmore\n");
  RunDirectory run;
  ASSERT_TRUE(RunDirectory::open(dir_.string(), &run).ok());
  Status s = run.require_traces();
  EXPECT_EQ(s.code(), ExitCode::kBadInput);
  EXPECT_EQ(s.message(),
            dir_.string() +
                ": no trace stream in streams/ (nothing was recorded) (r0.main.status: "
                "not attached: torch 2.9 has no interposer here)");
}

TEST(RankOfNameTest, ReadsTheRankOfProcessAndStreamNames) {
  EXPECT_EQ(rank_of_name("r3.main.t-main"), 3);
  EXPECT_EQ(rank_of_name("r12.main"), 12);
  EXPECT_EQ(rank_of_name("r0"), 0);
  EXPECT_EQ(rank_of_name("r-1.main.t-main"), -1);
  EXPECT_EQ(rank_of_name("rank3.main"), std::nullopt);
  EXPECT_EQ(rank_of_name("x3.main"), std::nullopt);
  EXPECT_EQ(rank_of_name("r"), std::nullopt);
  EXPECT_EQ(rank_of_name("r3x.main"), std::nullopt);
}

}  // namespace
}  // namespace detaudit::trace
