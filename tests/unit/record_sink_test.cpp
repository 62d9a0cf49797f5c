// A thread's record sink (hooks/stream/record_sink.h), torch-free: the stream file it writes
// reads back whole, its string table, the hand-over policy, and a header the disk refuses.
#include "stream/record_sink.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "trace/reader.h"

namespace detaudit::hooks {
namespace {

std::string temp_path(const std::string& name) {
  return std::string(::testing::TempDir()) + "/sink_" + name;
}

trace::StreamHeader header() {
  trace::StreamHeader h;
  h.algo = trace::DigestAlgo::kXxh3;
  h.rank = 3;
  h.process_role = "main";
  h.thread = "main";
  return h;
}

// A batch of digests computed apart that always has work: counts what the sink asks of it.
class CountingDigests final : public AsyncDigests {
 public:
  bool empty() const override { return false; }
  void submit_if_idle() override { ++submits; }
  bool run(long) override {
    ++runs;
    return true;
  }
  void discard() override { ++discards; }
  int submits = 0, runs = 0, discards = 0;
};

TEST(RecordSinkTest, TheStreamReadsBackWithEachStringBeforeTheRecordThatNamesIt) {
  const std::string path = temp_path("strings.dtr");
  RecordSink sink;
  ASSERT_TRUE(sink.start(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), header()));
  ASSERT_TRUE(sink.started());
  const uint32_t block = sink.intern("train/block");
  EXPECT_EQ(sink.intern("train/block"), block);  // one entry a string
  const uint32_t head = sink.intern("train/head");
  EXPECT_NE(head, block);
  for (uint32_t scope : {block, head, block}) {
    InBuffer in_buffer = sink.enter();
    ASSERT_TRUE(in_buffer.entered());
    EXPECT_TRUE(sink.inside());
    sink.write_strings();
    sink.encoder().scope(scope, sink.out());
    sink.commit();
    ++sink.totals().ops;
    sink.after_record();
  }
  EXPECT_FALSE(sink.inside());
  {
    InBuffer in_buffer = sink.enter();
    sink.end();
  }
  EXPECT_FALSE(sink.started());
  StreamWriter::instance().drain();

  trace::TraceReader reader;
  ASSERT_TRUE(reader.open(path).ok());
  EXPECT_EQ(reader.header().rank, 3u);
  int scopes = 0;
  trace::ReadResult r;
  // The reader refuses a SCOPE record naming a string it has not read yet.
  while ((r = reader.next()) == trace::ReadResult::kRecord)
    if (reader.kind() == trace::RecordKind::kScope) ++scopes;
  EXPECT_EQ(r, trace::ReadResult::kEof) << reader.error();
  EXPECT_EQ(scopes, 3);
  EXPECT_EQ(reader.string(block), "train/block");
  EXPECT_EQ(reader.string(head), "train/head");
  ASSERT_TRUE(reader.saw_end());
  EXPECT_EQ(reader.end_info().ops, 3u);
}

TEST(RecordSinkTest, ALargeBufferIsHandedOverAndTheDigestsComputedApartAreAskedFor) {
  const std::string path = temp_path("handover.dtr");
  CountingDigests digests;
  RecordSink sink(&digests);
  ASSERT_TRUE(sink.start(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), header()));
  const uint32_t id = sink.intern("train/block");
  size_t largest = 0;
  // About 8 bytes a record: 60,000 of them pass the 256 KiB of a hand-over.
  for (int i = 0; i < 60000; ++i) {
    InBuffer in_buffer = sink.enter();
    sink.write_strings();
    sink.encoder().scope(id, sink.out());
    sink.commit();
    largest = std::max(largest, sink.buffer()->bytes.size());
    sink.after_record();
  }
  EXPECT_LT(largest, size_t(256 * 1024) + 64) << "handed over once it reached 256 KiB";
  EXPECT_GE(digests.submits, 1);
  sink.release_held_for_save();
  EXPECT_EQ(digests.runs, 1);
  sink.reset_after_fork();
  EXPECT_EQ(digests.discards, 1);
  EXPECT_FALSE(sink.started());
  EXPECT_EQ(sink.intern("after the fork"), 0u) << "a forked child's string table starts afresh";
  StreamWriter::instance().drain();
}

TEST(RecordSinkTest, AHeaderTheDiskRefusesClosesTheFileAndSaysWhy) {
  const int fd = ::open("/dev/full", O_WRONLY);
  ASSERT_GE(fd, 0);
  RecordSink sink;
  EXPECT_FALSE(sink.start(fd, header()));
  EXPECT_EQ(errno, ENOSPC);
  EXPECT_EQ(sink.buffer()->fd, -1);
  EXPECT_EQ(::fcntl(fd, F_GETFD), -1) << "the refused file is closed";
  // Its records are dropped, and its END too: nothing is written to a closed file.
  EXPECT_TRUE(sink.started());
  sink.close_for_signal(15, false, false, "");
  sink.end();
  StreamWriter::instance().drain();
}

}  // namespace
}  // namespace detaudit::hooks
