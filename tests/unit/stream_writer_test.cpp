// The recorder's writer, torch-free: op threads hand whole records to one background thread,
// and a stop signal's freeze saves what each thread committed. Run under ThreadSanitizer by
// tests/tsan.sh.
#include "stream/stream_writer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace detaudit::hooks {
namespace {

std::string temp_path(const std::string& name) {
  return std::string(::testing::TempDir()) + "/writer_" + name;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Record k of thread t: its own text, so the file shows order and wholeness.
std::string record(int t, int k) { return "<" + std::to_string(t) + ":" + std::to_string(k) + ">"; }

// What an op thread does: append a whole record inside enter/leave_write, commit it, and hand
// the buffer over when it is full. Stops at `records` or when the streams are frozen.
void write_records(StreamBuffer* s, int t, int records) {
  for (int k = 0; k < records; ++k) {
    if (!s->enter_write()) return;
    s->bytes += record(t, k);
    s->committed.store(s->bytes.size(), std::memory_order_release);
    if (s->bytes.size() > 512) StreamWriter::instance().hand_over(s);
    s->leave_write();
  }
}

struct Streams {
  explicit Streams(const std::string& name, int n) : buffers(n) {
    for (int t = 0; t < n; ++t) {
      paths.push_back(temp_path(name + std::to_string(t)));
      buffers[size_t(t)].fd = ::open(paths.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }
  }
  ~Streams() {
    for (StreamBuffer& b : buffers) ::close(b.fd);
  }
  std::vector<StreamBuffer> buffers;
  std::vector<std::string> paths;
};

TEST(StreamWriterTest, EveryThreadsRecordsReachItsFileInOrder) {
  constexpr int kThreads = 4, kRecords = 4000;
  Streams streams("order", kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back(write_records, &streams.buffers[size_t(t)], t, kRecords);
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    StreamBuffer& s = streams.buffers[size_t(t)];
    s.enter_write();
    StreamWriter::instance().hand_over(&s);
    s.leave_write();
  }
  StreamWriter::instance().drain();
  for (int t = 0; t < kThreads; ++t) {
    std::string want;
    for (int k = 0; k < kRecords; ++k) want += record(t, k);
    EXPECT_EQ(read_file(streams.paths[size_t(t)]), want) << "thread " << t;
  }
}

// The stopped thread's buffer: saved as it stands, never settled inside the freeze (settling
// frees memory of its malloc arena, whose lock it may hold); what it commits after, once settled
// last, is appended once.
TEST(StreamWriterTest, TheStoppedThreadsBufferIsSavedUnsettledAndWhatItCommitsLaterOnce) {
  Streams streams("stopped", 2);
  for (int t = 0; t < 2; ++t) {
    StreamBuffer& s = streams.buffers[size_t(t)];
    for (int k = 0; k < 3; ++k) s.bytes += record(t, k);
    s.committed.store(s.bytes.size());
    s.bytes += "<partial";  // a record being written: never saved
  }
  struct Job {
    Streams* streams;
    std::vector<size_t> settled;
    size_t own_saved = 0;
  } job{&streams, {}, 0};
  StreamWriter::instance().run_from_signal(
      [](void* arg) {
        auto* j = static_cast<Job*>(arg);
        std::vector<StreamBuffer*> all{&j->streams->buffers[0], &j->streams->buffers[1]};
        StreamBuffer* own = all[1];
        j->own_saved = StreamWriter::instance().freeze_and_save(
            all, own, [&](size_t i, long) { j->settled.push_back(i); }, 60000);
        // As ProcessRecorder::save_on_stop_signal does last: its held records released.
        own->bytes.resize(own->committed.load());
        own->bytes += record(1, 3);
        own->committed.store(own->bytes.size());
        StreamWriter::instance().crash_flush(own, j->own_saved);
      },
      &job, /*max_wait_ms=*/60000);
  g_streams_frozen.store(false);  // for the tests that follow in this process
  EXPECT_EQ(job.settled, (std::vector<size_t>{0}));
  EXPECT_EQ(job.own_saved, record(1, 0).size() * 3);
  EXPECT_EQ(read_file(streams.paths[0]), record(0, 0) + record(0, 1) + record(0, 2));
  EXPECT_EQ(read_file(streams.paths[1]), record(1, 0) + record(1, 1) + record(1, 2) + record(1, 3));
}

// Settling waits for the digest thread, which a loaded host may starve: the waits of all
// streams together stay within the budget, and every stream is saved, settled or not.
TEST(StreamWriterTest, SettlingStaysWithinItsBudgetAndEveryStreamIsSaved) {
  constexpr int kStreams = 4;
  Streams streams("budget", kStreams);
  for (int t = 0; t < kStreams; ++t) {
    StreamBuffer& s = streams.buffers[size_t(t)];
    s.bytes = record(t, 0);
    s.committed.store(s.bytes.size());
  }
  struct Job {
    Streams* streams;
    std::vector<size_t> settled;
  } job{&streams, {}};
  const auto start = std::chrono::steady_clock::now();
  StreamWriter::instance().run_from_signal(
      [](void* arg) {
        auto* j = static_cast<Job*>(arg);
        std::vector<StreamBuffer*> all;
        for (StreamBuffer& b : j->streams->buffers) all.push_back(&b);
        // Each settle waits as long as it is allowed: a digest thread that never comes back.
        StreamWriter::instance().freeze_and_save(
            all, nullptr,
            [&](size_t i, long max_wait_ms) {
              j->settled.push_back(i);
              std::this_thread::sleep_for(std::chrono::milliseconds(max_wait_ms));
            },
            /*budget_ms=*/300);
      },
      &job, /*max_wait_ms=*/60000);
  const auto took = std::chrono::steady_clock::now() - start;
  g_streams_frozen.store(false);  // for the tests that follow in this process
  EXPECT_LT(took, std::chrono::seconds(3));
  EXPECT_FALSE(job.settled.empty());
  EXPECT_LT(job.settled.size(), size_t(kStreams)) << "the budget was spent on the first";
  for (int t = 0; t < kStreams; ++t)
    EXPECT_EQ(read_file(streams.paths[size_t(t)]), record(t, 0)) << "stream " << t;
}

// SIGTERM's path: a freeze while threads write saves, per stream, whole records only, in order,
// and no thread changes its buffer afterwards.
TEST(StreamWriterTest, AFreezeWhileThreadsWriteSavesWholeRecordsInOrder) {
  constexpr int kThreads = 3, kRecords = 200000;
  Streams streams("freeze", kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> started{0};
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      ++started;
      write_records(&streams.buffers[size_t(t)], t, kRecords);
    });
  while (started.load() < kThreads) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::vector<StreamBuffer*> all;
  for (StreamBuffer& b : streams.buffers) all.push_back(&b);
  // Each thread leaves its write: each stream is settled (its held records released) before
  // it is saved.
  std::vector<size_t> settled;
  struct Freeze {
    std::vector<StreamBuffer*>* all;
    std::vector<size_t>* settled;
  } freeze{&all, &settled};
  // As a stop signal's handler does: on the writer thread.
  StreamWriter::instance().run_from_signal(
      [](void* arg) {
        auto* f = static_cast<Freeze*>(arg);
        StreamWriter::instance().freeze_and_save(
            *f->all, nullptr, [&](size_t i, long) { f->settled->push_back(i); }, 60000);
      },
      &freeze, /*max_wait_ms=*/60000);
  EXPECT_EQ(settled, (std::vector<size_t>{0, 1, 2}));
  for (std::thread& th : threads) th.join();
  StreamWriter::instance().drain();
  g_streams_frozen.store(false);  // for the tests that follow in this process
  for (int t = 0; t < kThreads; ++t) {
    const std::string got = read_file(streams.paths[size_t(t)]);
    std::string want;
    for (int k = 0; want.size() < got.size() && k < kRecords; ++k) want += record(t, k);
    EXPECT_FALSE(got.empty()) << "thread " << t;
    EXPECT_EQ(got, want) << "thread " << t << ": not a prefix of whole records";
  }
}

// A program's kernels may give other bits at other addresses: handing over at clock-driven
// moments, and the writer freeing when it is done, must not move the program's allocations.
TEST(StreamWriterTest, HandingOverTakesNothingFromMalloc) {
  Streams streams("heap", 1);
  StreamBuffer& s = streams.buffers[0];
  s.bytes.reserve(64 * 1024);
  StreamWriter::instance().start();
  auto heap = [] {
    struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
  };
  const size_t before = heap();
  for (int k = 0; k < 200; ++k) {
    s.enter_write();
    s.bytes.append(16 * 1024, char('a' + k % 26));
    s.committed.store(s.bytes.size());
    StreamWriter::instance().hand_over(&s);
    s.leave_write();
  }
  EXPECT_EQ(heap(), before);
  StreamWriter::instance().drain();
  EXPECT_EQ(heap(), before);
  EXPECT_EQ(read_file(streams.paths[0]).size(), size_t(200 * 16 * 1024));
}

// The saving a signal's handler asks for allocates. A thread stopped inside malloc holds its
// arena's lock: the job runs on the writer thread, and the handler returns. (Run here on the
// signal's own thread, this deadlocked at the first signal.) An allocator with a lock of its
// own across threads (ASan's) can hold the writer back too: the handler waits for it at most
// 2 s, and the job runs once the thread left malloc.
std::atomic<int> g_saves{0};
std::atomic<bool> g_stop_allocating{false};
std::atomic<long> g_allocating_rounds{0};  // static: the thread may outlive a failed test
void save_something(void*) {
  {
    std::vector<std::string> lines;
    for (int i = 0; i < 64; ++i) lines.push_back(std::string(4096 + i, 'x'));
  }
  // Counted once its memory is freed too: the test's next signal must not find this job still
  // in free() (under ASan, held by the lock its own thread holds: that handler would give up
  // waiting for the writer, by design, and its save never run).
  g_saves.fetch_add(1);
}
void on_test_signal(int) {
  StreamWriter::instance().run_from_signal(save_something, nullptr, 2000);
}

TEST(StreamWriterTest, ASignalsSavingNeverWaitsForALockItsThreadHolds) {
  StreamWriter::instance().start();
  struct sigaction sa {};
  sa.sa_handler = on_test_signal;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &sa, nullptr), 0);
  // Sizes past the thread cache: each malloc and free takes the arena's lock.
  std::thread allocating([] {
    while (!g_stop_allocating.load()) {
      std::vector<void*> blocks;
      for (int i = 0; i < 32; ++i) blocks.push_back(std::malloc(size_t(8192 + 64 * i)));
      for (void* b : blocks) std::free(b);
      g_allocating_rounds.fetch_add(1);
    }
  });
  while (g_allocating_rounds.load() == 0) std::this_thread::yield();
  constexpr int kSignals = 300;
  for (int k = 0; k < kSignals; ++k) {
    const int before = g_saves.load();
    ASSERT_EQ(pthread_kill(allocating.native_handle(), SIGUSR1), 0);
    // The handler returns once the job ran (or after 2 s); then the thread allocates again.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (g_saves.load() == before && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    if (g_saves.load() == before) {
      allocating.detach();  // stuck for good
      FAIL() << "signal " << k << ": the saving never ran";
    }
  }
  const long r = g_allocating_rounds.load();
  while (g_allocating_rounds.load() == r) std::this_thread::yield();  // the thread still runs
  g_stop_allocating.store(true);
  allocating.join();
  ::signal(SIGUSR1, SIG_DFL);
  EXPECT_EQ(g_saves.load(), kSignals);
}

// Hands `chunks` chunks of `bytes` each to the writer, for the pipe's write end.
void hand_over_chunks(StreamBuffer* s, int chunks, size_t bytes) {
  for (int k = 0; k < chunks; ++k) {
    s->enter_write();
    s->bytes.append(bytes, char('a' + k % 26));
    s->committed.store(s->bytes.size());
    StreamWriter::instance().hand_over(s);
    s->leave_write();
  }
}

// How long drain(stall_ms) took, in seconds.
double seconds_to_drain(long stall_ms) {
  const auto t0 = std::chrono::steady_clock::now();
  StreamWriter::instance().drain(stall_ms);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// At exit, a slow disk holds each write() for a while: drain() waits for as long as chunks keep
// being written, well past its stall limit in all, so no stream loses its last bytes.
TEST(StreamWriterTest, DrainWaitsWhileTheWriterMakesProgress) {
  ::signal(SIGPIPE, SIG_IGN);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  StreamBuffer s;
  s.fd = fds[1];
  constexpr int kChunks = 24;
  constexpr size_t kChunkBytes = 32 * 1024;
  std::atomic<size_t> got{0};
  std::thread reader([&] {  // 64 KiB every 100 ms: about 1.2 s in all
    std::vector<char> buf(64 * 1024);
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      ssize_t n = ::read(fds[0], buf.data(), buf.size());
      if (n <= 0) return;
      got += size_t(n);
    }
  });
  hand_over_chunks(&s, kChunks, kChunkBytes);
  const double waited = seconds_to_drain(/*stall_ms=*/400);
  ::close(fds[1]);  // the reader takes what the pipe still holds, then sees the end
  reader.join();
  ::close(fds[0]);
  EXPECT_EQ(got.load(), size_t(kChunks) * kChunkBytes);
  EXPECT_GT(waited, 0.4) << "the test did not hold the writer back";
}

// A writer that makes no progress at all (a dead disk) does not hang the program's exit.
TEST(StreamWriterTest, DrainGivesUpOnAStalledWriter) {
  ::signal(SIGPIPE, SIG_IGN);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  StreamBuffer s;
  s.fd = fds[1];
  hand_over_chunks(&s, 4, 64 * 1024);  // more than the pipe holds, and nobody reads
  const double waited = seconds_to_drain(/*stall_ms=*/200);
  EXPECT_LT(waited, 10.0);
  ::close(fds[0]);  // the blocked write() fails with EPIPE and the writer moves on
  StreamWriter::instance().drain();
  ::close(fds[1]);
}

// A stop signal's handler as the interposer's: put off while its thread is inside its buffer,
// else "saved" at once; what the buffer showed then is kept for the test.
struct StopSave {
  StopSave(StreamBuffer* b, StreamWriter::StopBounds limits) : buffer(b), bounds(limits) {}
  StopSave(StreamBuffer* b, long bound_ms) : StopSave(b, {bound_ms, bound_ms}) {}
  StreamBuffer* buffer;
  StreamWriter::StopBounds bounds;
  pid_t tid = 0;
  std::atomic<int> calls{0};
  std::atomic<bool> saved{false};
  std::atomic<bool> saved_while_writing{false};
  std::atomic<size_t> saved_committed{0};
  std::atomic<int64_t> saved_at_ms{0};
};
StopSave* g_stop = nullptr;
void on_test_stop(int sig) {
  g_stop->calls.fetch_add(1);
  if (StreamWriter::instance().defer_stop_signal(g_stop->buffer, sig, g_stop->tid, g_stop->bounds))
    return;
  g_stop->saved_while_writing.store(g_stop->buffer->writing.load());
  g_stop->saved_committed.store(g_stop->buffer->committed.load());
  g_stop->saved_at_ms.store(monotonic_ms());
  g_stop->saved.store(true);
}

// Runs `body` on a thread of its own with on_test_stop as SIGUSR2's handler.
template <typename Body>
void with_stop_handler(StopSave* stop, Body body) {
  StreamWriter::instance().start();
  g_stop = stop;
  struct sigaction sa {};
  sa.sa_handler = on_test_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_NODEFER;  // as the interposer's
  ASSERT_EQ(sigaction(SIGUSR2, &sa, nullptr), 0);
  std::thread t([&] {
    stop->tid = pid_t(::syscall(SYS_gettid));
    body();
  });
  t.join();
  ::signal(SIGUSR2, SIG_DFL);
  g_stop = nullptr;
}

// A stop signal that comes while its thread is changing its buffer waits until the thread leaves
// it: the save then sees the record the thread was writing, whole. A second one meanwhile waits
// with it.
TEST(StreamWriterTest, AStopSignalInsideTheBufferIsSavedAsTheThreadLeavesIt) {
  StreamBuffer s;
  StopSave stop(&s, 10000);
  int64_t left_at = 0;
  with_stop_handler(&stop, [&] {
    ASSERT_TRUE(s.enter_write());
    s.bytes += record(0, 0);
    ::raise(SIGUSR2);  // as a SIGTERM that lands mid-record
    ::raise(SIGUSR2);
    EXPECT_FALSE(stop.saved.load()) << "saved while the thread was inside its buffer";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    s.bytes += record(0, 1);
    s.committed.store(s.bytes.size());
    left_at = monotonic_ms();
    s.leave_write();  // raises it again, here
  });
  EXPECT_TRUE(stop.saved.load());
  EXPECT_EQ(stop.calls.load(), 3);
  EXPECT_FALSE(stop.saved_while_writing.load());
  EXPECT_EQ(stop.saved_committed.load(), (record(0, 0) + record(0, 1)).size());
  EXPECT_GE(stop.saved_at_ms.load(), left_at);
  EXPECT_EQ(s.deferred_signal.load(), 0);
}

// Between records a thread may be anywhere, inside malloc too: its stop signal is saved after
// its next whole record, at a point the test (the interposer) knows.
TEST(StreamWriterTest, AStopSignalBetweenRecordsIsSavedAfterTheThreadsNextRecord) {
  StreamBuffer s;
  StopSave stop(&s, 10000);
  with_stop_handler(&stop, [&] {
    ::raise(SIGUSR2);
    EXPECT_FALSE(stop.saved.load()) << "saved between records";
    ASSERT_TRUE(s.enter_write());
    s.bytes += record(0, 0);
    s.committed.store(s.bytes.size());
    s.leave_write();
  });
  EXPECT_TRUE(stop.saved.load());
  EXPECT_EQ(stop.calls.load(), 2);
  EXPECT_FALSE(stop.saved_while_writing.load());
  EXPECT_EQ(stop.saved_committed.load(), record(0, 0).size());
}

// Raises the stop signal on this thread, then waits for its save (made by the writer thread's
// raise, the thread being inside its buffer) or for give_up_ms; returns when it was raised.
int64_t raise_and_wait_for_the_save(const StopSave& stop, int64_t give_up_ms) {
  const int64_t raised_at = monotonic_ms();
  ::raise(SIGUSR2);
  while (!stop.saved.load() && monotonic_ms() < raised_at + give_up_ms)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return raised_at;
}

// A thread that does not leave its buffer within the bound (stuck in an op's record; or, between
// records, waiting in a collective) is not waited for longer: the writer thread raises the
// signal on it again, and that one is saved there and then, with what is whole. Leaving the
// buffer later raises nothing more.
TEST(StreamWriterTest, AStopSignalPutOffPastItsBoundIsRaisedByTheWriterThread) {
  StreamBuffer s;
  StopSave stop(&s, 100);
  int64_t raised_at = 0;
  with_stop_handler(&stop, [&] {
    ASSERT_TRUE(s.enter_write());
    s.bytes += record(0, 0);
    s.committed.store(s.bytes.size());
    raised_at = raise_and_wait_for_the_save(stop, /*give_up_ms=*/10000);
    s.leave_write();
  });
  ASSERT_TRUE(stop.saved.load()) << "the writer thread never raised the signal put off";
  EXPECT_TRUE(stop.saved_while_writing.load());
  EXPECT_EQ(stop.saved_committed.load(), record(0, 0).size());
  EXPECT_GE(stop.saved_at_ms.load() - raised_at, 100);
  EXPECT_EQ(stop.calls.load(), 2);
}

// A thread that was between records when the signal came and then enters its buffer (its END,
// written at exit) has the inside bound from then to leave it: raised at the outside bound,
// it was saved mid-record, and its stream lost that record, the END.
TEST(StreamWriterTest, AThreadThatEntersItsBufferAfterTheSignalIsGivenTheInsideBound) {
  StreamBuffer s;
  StopSave stop(&s, {/*outside_ms=*/100, /*inside_ms=*/10000});
  int64_t left_at = 0;
  with_stop_handler(&stop, [&] {
    ::raise(SIGUSR2);
    ASSERT_TRUE(s.enter_write());
    s.bytes += record(0, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(400));  // past the outside bound
    EXPECT_FALSE(stop.saved.load()) << "saved while the thread wrote its record";
    s.committed.store(s.bytes.size());
    left_at = monotonic_ms();
    s.leave_write();
  });
  EXPECT_TRUE(stop.saved.load());
  EXPECT_EQ(stop.calls.load(), 2);
  EXPECT_FALSE(stop.saved_while_writing.load());
  EXPECT_EQ(stop.saved_committed.load(), record(0, 0).size());
  EXPECT_GE(stop.saved_at_ms.load(), left_at);
}

// Still bounded: a thread that stays inside is raised again at the inside bound from its entering.
TEST(StreamWriterTest, AThreadThatEntersItsBufferAndStaysIsRaisedAtTheInsideBound) {
  StreamBuffer s;
  StopSave stop(&s, {/*outside_ms=*/100, /*inside_ms=*/300});
  int64_t raised_at = 0;
  with_stop_handler(&stop, [&] {
    raised_at = monotonic_ms();
    ::raise(SIGUSR2);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(s.enter_write());
    while (!stop.saved.load() && monotonic_ms() < raised_at + 10000)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    s.leave_write();
  });
  ASSERT_TRUE(stop.saved.load()) << "the writer thread never raised the signal put off";
  EXPECT_TRUE(stop.saved_while_writing.load());
  EXPECT_GE(stop.saved_at_ms.load() - raised_at, 350);
  EXPECT_EQ(stop.calls.load(), 2);
}

// The writer thread stuck in a write, as on a dead disk: more than a pipe holds, handed over to
// it while nobody reads; freed at the end of the scope (the write fails with EPIPE).
struct StuckWriter {
  StuckWriter() {
    ::signal(SIGPIPE, SIG_IGN);
    EXPECT_EQ(::pipe(fds), 0);
    buffer.fd = fds[1];
    hand_over_chunks(&buffer, 4, 64 * 1024);
  }
  ~StuckWriter() {
    ::close(fds[0]);
    StreamWriter::instance().drain();
    ::close(fds[1]);
  }
  int fds[2] = {-1, -1};
  StreamBuffer buffer;
};

// A writer thread stuck in a write (a dead disk) cannot raise the signal put off: a stop signal
// that comes after its bound (the scheduler's second, Ctrl-C pressed again) is saved at once.
TEST(StreamWriterTest, AStopSignalAfterTheBoundOfTheOnePutOffIsSavedAtOnce) {
  StuckWriter stuck;
  StreamBuffer s;
  StopSave stop(&s, 100);
  with_stop_handler(&stop, [&] {
    ASSERT_TRUE(s.enter_write());
    ::raise(SIGUSR2);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_FALSE(stop.saved.load()) << "the writer thread was not stuck";
    ::raise(SIGUSR2);
    EXPECT_TRUE(stop.saved.load());
    EXPECT_TRUE(stop.saved_while_writing.load());
    s.leave_write();  // the one put off, raised here while the writer is still stuck
  });
  EXPECT_EQ(stop.calls.load(), 3);
  EXPECT_EQ(s.deferred_signal.load(), 0);
}

// Nor is a stop signal put off at all while the writer has been stuck in one write for a while:
// nothing would raise it again.
TEST(StreamWriterTest, AStopSignalIsNotPutOffWhileTheWriterIsStuck) {
  StuckWriter stuck;
  std::this_thread::sleep_for(std::chrono::milliseconds(StreamWriter::kWriterStuckMs + 200));
  StreamBuffer s;
  StopSave stop(&s, 10000);
  with_stop_handler(&stop, [&] {
    ASSERT_TRUE(s.enter_write());
    ::raise(SIGUSR2);
    EXPECT_TRUE(stop.saved.load());
    s.leave_write();
  });
  EXPECT_EQ(stop.calls.load(), 1);
}

// An idle writer thread sleeps until it has work, rather than polling: it polled every 2 ms,
// and on a host of two cores each round took one from the program's OpenMP team.
TEST(StreamWriterTest, AnIdleWriterMakesAboutOneRoundEachIdleInterval) {
  StreamWriter& writer = StreamWriter::instance();
  writer.drain();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const uint64_t before = writer.rounds();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_LE(writer.rounds() - before, 500 / StreamWriter::kIdleMs + 3);
}

// Each test below runs with the writer asleep for 10 s unless woken: what it waits for must wake
// it, or take those 10 s.
struct LongIdle {
  LongIdle() {
    StreamWriter::instance().drain();
    StreamWriter::instance().set_idle_ms(10000);
    // Its last short sleep ends; then it is in the long one.
    std::this_thread::sleep_for(std::chrono::milliseconds(StreamWriter::kIdleMs + 200));
  }
  ~LongIdle() {
    StreamWriter::instance().set_idle_ms(StreamWriter::kIdleMs);
    // A chunk wakes it, and from then on it sleeps for kIdleMs again.
    StreamBuffer s;
    s.fd = ::open("/dev/null", O_WRONLY);
    hand_over_chunks(&s, 1, 16);
    StreamWriter::instance().drain();
    ::close(s.fd);
  }
};

TEST(StreamWriterTest, AChunkHandedOverWakesTheWriter) {
  LongIdle idle;
  Streams streams("woken", 1);
  hand_over_chunks(&streams.buffers[0], 1, 100);
  EXPECT_LT(seconds_to_drain(/*stall_ms=*/3000), 3.0);
  EXPECT_EQ(read_file(streams.paths[0]), std::string(100, 'a'));
}

TEST(StreamWriterTest, ASignalsJobWakesTheWriter) {
  LongIdle idle;
  static std::atomic<bool> ran{false};
  ran = false;
  StreamWriter::instance().run_from_signal([](void*) { ran = true; }, nullptr,
                                           /*max_wait_ms=*/3000);
  EXPECT_TRUE(ran.load()) << "the writer thread slept through the signal's job";
}

TEST(StreamWriterTest, AStopSignalPutOffWakesTheWriterToRaiseItAtItsBound) {
  LongIdle idle;
  StreamBuffer s;
  StopSave stop(&s, 100);
  int64_t raised_at = 0;
  with_stop_handler(&stop, [&] {
    ASSERT_TRUE(s.enter_write());
    raised_at = raise_and_wait_for_the_save(stop, /*give_up_ms=*/5000);
    s.leave_write();
  });
  ASSERT_TRUE(stop.saved.load()) << "the writer thread slept past the bound";
  EXPECT_LT(stop.saved_at_ms.load() - raised_at, 3000);
}

}  // namespace
}  // namespace detaudit::hooks
