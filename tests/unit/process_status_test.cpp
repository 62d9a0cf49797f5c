// A process's .status file: the ending line the interposer writes reads back field for field,
// and an old or foreign line is not taken for one.
#include "trace/process_status.h"

#include <gtest/gtest.h>

#include <fstream>

namespace detaudit::trace {
namespace {

TEST(ProcessStatusTest, EndingLinesRoundTrip) {
  ProcessEnding exit_line;
  ProcessEnding abort_line;
  abort_line.how = ProcessEnding::How::kKilled;
  abort_line.signal = "SIGABRT";
  abort_line.exiting = true;
  ProcessEnding inside;
  inside.how = ProcessEnding::How::kKilled;
  inside.signal = "SIGSEGV";
  inside.thread = "pt_autograd_0";
  inside.inside_op = "aten::index_add_";
  inside.inside_step = 12;
  ProcessEnding stopped;
  stopped.how = ProcessEnding::How::kInterrupted;
  stopped.signal = "SIGTERM";
  stopped.thread = "main";
  for (const ProcessEnding& e : {exit_line, abort_line, inside, stopped}) {
    ProcessEnding back;
    ASSERT_TRUE(parse_ending(e.line(), &back)) << e.line();
    EXPECT_EQ(back.line(), e.line());
    EXPECT_EQ(back.how, e.how);
    EXPECT_EQ(back.signal, e.signal);
    EXPECT_EQ(back.thread, e.thread);
    EXPECT_EQ(back.inside_op, e.inside_op);
    EXPECT_EQ(back.inside_step, e.inside_step);
    EXPECT_EQ(back.exiting, e.exiting);
  }
  EXPECT_EQ(exit_line.line(), "ended: exit");
  EXPECT_EQ(abort_line.line(),
            "ended: killed by SIGABRT | after its last recorded op | while exiting");
  EXPECT_EQ(inside.describe(),
            "killed by SIGSEGV on thread pt_autograd_0 inside aten::index_add_ (step 12), which "
            "never finished");
  EXPECT_EQ(signal_text(6), "SIGABRT");
}

TEST(ProcessStatusTest, OnlyEndingLinesAreEndings) {
  ProcessEnding e;
  EXPECT_FALSE(parse_ending("attached libtorch 2.13.0 pid 1", &e));
  EXPECT_FALSE(parse_ending("interrupted by SIGTERM", &e));  // detaudit 0.2's stop line
  EXPECT_FALSE(parse_ending("ended: vanished", &e));
}

TEST(ProcessStatusTest, TheLastEndingOfAFileCounts) {
  const std::string path = std::string(::testing::TempDir()) + "/r1.main.status";
  std::ofstream(path)
      << "attached libtorch 2.13.0 pid 7\nmd5 batches: 1 runs\n"
      << "ended: interrupted by SIGTERM | thread main | after its last recorded op\n";
  ProcessStatus s;
  ASSERT_TRUE(read_process_status(path, &s));
  EXPECT_EQ(s.first_line, "attached libtorch 2.13.0 pid 7");
  ASSERT_TRUE(s.ending.has_value());
  EXPECT_EQ(s.ending->how, ProcessEnding::How::kInterrupted);
  std::ofstream(path) << "attached libtorch 2.13.0 pid 7\n";
  ASSERT_TRUE(read_process_status(path, &s));
  EXPECT_FALSE(s.ending.has_value());  // killed with no chance to say so
  EXPECT_FALSE(read_process_status(path + ".missing", &s));
}

}  // namespace
}  // namespace detaudit::trace
