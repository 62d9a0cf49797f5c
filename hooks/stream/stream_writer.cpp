#include "stream/stream_writer.h"

#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>

namespace detaudit::hooks {
namespace {

thread_local bool t_on_writer_thread = false;

}  // namespace

void sleep_ms(long ms) {
  timespec ts{0, ms * 1000000L};
  nanosleep(&ts, nullptr);  // async-signal-safe, unlike std::this_thread::sleep_for
}

int64_t monotonic_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

bool write_fully(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;  // a full disk must not take the training run down
    }
    p += w;
    n -= size_t(w);
  }
  return true;
}

StreamWriter& StreamWriter::instance() {
  // Never destroyed: op threads and exit handlers may still call it during static destruction.
  static StreamWriter* writer = new StreamWriter();
  return *writer;
}

void StreamWriter::ensure_thread() {
  bool expected = false;
  if (started_.compare_exchange_strong(expected, true)) {
    writer_beat_ms_.store(monotonic_ms());  // a writer not yet in its loop is not stuck
    std::thread([this] { run(); }).detach();
  }
}

void StreamWriter::release(Chunk* chunk) { ::munmap(chunk, sizeof(Chunk) + chunk->size); }

void StreamWriter::write_all(int fd, const char* p, size_t n) {
  if (write_fully(fd, p, n)) return;
  int none = 0;
  if (!write_errno_.compare_exchange_strong(none, errno)) return;
  write_error_fd_.store(fd);
  // Said once, now, with write(): this may run in a signal's save, and a stdio lock may be held.
  const std::string line = "detaudit: error: cannot write the trace: " + first_write_error() +
                           "; the stream is cut here, the program goes on\n";
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

std::string StreamWriter::first_write_error() const {
  const int err = write_errno_.load();
  if (err == 0) return "";
  char path[512] = {};
  const std::string link = "/proc/self/fd/" + std::to_string(write_error_fd_.load());
  if (::readlink(link.c_str(), path, sizeof path - 1) < 0) path[0] = '\0';
  return std::string(std::strerror(err)) + " (" + (path[0] ? path : "a stream") + ")";
}

void StreamWriter::hand_over(StreamBuffer* stream) {
  if (stream->bytes.empty()) return;
  if (stream->fd < 0) {  // a stream that has no file (it could not be created): nothing to keep
    stream->bytes.clear();
    stream->committed.store(0, std::memory_order_release);
    return;
  }
  const size_t n = stream->bytes.size();
  void* mem = ::mmap(nullptr, sizeof(Chunk) + n, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    // No memory for a chunk: write after what is queued, on this thread, rather than lose it.
    drain();
    write_all(stream->fd, stream->bytes.data(), n);
    stream->bytes.clear();
    stream->committed.store(0, std::memory_order_release);
    return;
  }
  auto* chunk = new (mem) Chunk{stream->fd, n, nullptr};
  std::memcpy(chunk->data(), stream->bytes.data(), n);
  stream->bytes.clear();  // keeps its capacity: no allocation on the op path
  stream->committed.store(0, std::memory_order_release);
  chunk->next = head_.load(std::memory_order_relaxed);
  while (!head_.compare_exchange_weak(chunk->next, chunk, std::memory_order_release,
                                      std::memory_order_relaxed)) {
  }
  pushed_.fetch_add(1, std::memory_order_release);
  ensure_thread();
  wake();
}

void StreamWriter::wake() {
  wake_seq_.fetch_add(1, std::memory_order_seq_cst);
  if (writer_idle_.load(std::memory_order_seq_cst))
    ::syscall(SYS_futex, &wake_seq_, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

void StreamWriter::idle() {
  // Idle first, then the sequence, then the work: a wake() that saw the writer busy bumped the
  // sequence before it is read here, and what it announced is seen below, a stop put off too.
  writer_idle_.store(true, std::memory_order_seq_cst);
  const uint32_t seen = wake_seq_.load(std::memory_order_seq_cst);
  long ms = idle_ms_.load();    // polling every 2 ms woke a core 500 times a second
  if (deferred_stream_.load())  // raised again at its bound
    ms = std::clamp<long>(long(deferred_until_ms_.load() - monotonic_ms()), 1, ms);
  const bool work = head_.load(std::memory_order_acquire) != nullptr ||
                    signal_jobs_asked_.load(std::memory_order_acquire) !=
                        signal_jobs_done_.load(std::memory_order_relaxed);
  if (!work) {
    timespec ts{ms / 1000, (ms % 1000) * 1000000L};
    ::syscall(SYS_futex, &wake_seq_, FUTEX_WAIT_PRIVATE, seen, &ts, nullptr, 0);
  }
  writer_idle_.store(false, std::memory_order_relaxed);
}

size_t StreamWriter::write_pending() {
  Chunk* list = head_.exchange(nullptr, std::memory_order_acquire);
  // The stack is newest first; reverse it so each stream's chunks land in order.
  Chunk* ordered = nullptr;
  while (list) {
    Chunk* next = list->next;
    list->next = ordered;
    ordered = list;
    list = next;
  }
  size_t n = 0;
  while (ordered) {
    Chunk* next = ordered->next;
    write_all(ordered->fd, ordered->data(), ordered->size);
    release(ordered);
    ordered = next;
    ++n;
    written_.fetch_add(1, std::memory_order_release);  // chunk by chunk: drain() sees progress
  }
  return n;
}

void StreamWriter::run() {
  // Named for top, perf and the bench's time by thread (tests/bench/workloads.py).
  pthread_setname_np(pthread_self(), "detaudit-writer");
  // Signals go to the program's threads, never here: a handler's job runs on this thread.
  sigset_t async;
  sigfillset(&async);
  for (int sync : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) sigdelset(&async, sync);
  pthread_sigmask(SIG_BLOCK, &async, nullptr);
  t_on_writer_thread = true;
  for (;;) {
    writer_beat_ms_.store(monotonic_ms(), std::memory_order_relaxed);
    rounds_.fetch_add(1, std::memory_order_relaxed);
    size_t n = write_pending();
    const uint64_t asked = signal_jobs_asked_.load(std::memory_order_acquire);
    if (asked != signal_jobs_done_.load(std::memory_order_relaxed)) {
      const SignalJob job = signal_job_;
      job.run(job.arg);
      signal_job_claimed_.store(false, std::memory_order_release);
      signal_jobs_done_.store(asked, std::memory_order_release);
    }
    raise_overdue_stop();
    if (n == 0) idle();
  }
}

bool StreamWriter::defer_stop_signal(StreamBuffer* own, int sig, pid_t tid, StopBounds bounds) {
  if (raised_again_.exchange(false)) return false;  // the one put off: saved now
  if (!own || !started_.load() || g_streams_frozen.load()) return false;
  // A writer thread stuck in a write (a dead disk) would not raise it after its bound.
  if (monotonic_ms() - writer_beat_ms_.load(std::memory_order_relaxed) > kWriterStuckMs)
    return false;
  // One is put off already: this one waits with it, unless its bound has passed (the writer
  // thread, which would have raised it, may be stuck in a write to a dead disk).
  if (deferred_stream_.load()) return monotonic_ms() < deferred_until_ms_.load();
  deferred_tid_.store(tid);
  const bool inside = own->writing.load();
  deferred_until_ms_.store(monotonic_ms() + (inside ? bounds.inside_ms : bounds.outside_ms));
  deferred_inside_ms_.store(inside ? 0 : bounds.inside_ms);
  own->deferred_signal.store(sig);
  deferred_stream_.store(own);
  wake();  // to wait no longer than its bound
  return true;
}

void raise_deferred_stop(StreamBuffer* stream) {
  const int sig = stream->deferred_signal.exchange(0);
  if (sig == 0) return;  // the writer thread raised it meanwhile
  StreamWriter& writer = StreamWriter::instance();
  writer.raised_again_.store(true);
  writer.deferred_stream_.store(nullptr);
  ::raise(sig);
}

void stop_deferred_while_inside() {
  // Said by the buffer's own thread: the writer thread reading `writing` for it could read a
  // buffer whose thread ended meanwhile.
  StreamWriter& writer = StreamWriter::instance();
  if (const long inside_ms = writer.deferred_inside_ms_.exchange(0); inside_ms > 0)
    writer.deferred_until_ms_.store(monotonic_ms() + inside_ms);
}

void StreamWriter::raise_overdue_stop() {
  StreamBuffer* stream = deferred_stream_.load(std::memory_order_relaxed);
  if (!stream || monotonic_ms() < deferred_until_ms_.load()) return;
  const int sig = stream->deferred_signal.exchange(0);
  if (sig != 0) raised_again_.store(true);
  deferred_stream_.store(nullptr);
  if (sig != 0) ::syscall(SYS_tgkill, ::getpid(), deferred_tid_.load(), sig);
}

void StreamWriter::run_from_signal(void (*job)(void*), void* arg, long max_wait_ms) {
  if (!started_.load() || t_on_writer_thread) {
    job(arg);
    return;
  }
  // By the clock: on a loaded machine a 1 ms sleep takes several.
  const int64_t deadline = monotonic_ms() + max_wait_ms;
  // One job at a time: another thread's signal may be being handled.
  while (signal_job_claimed_.exchange(true, std::memory_order_acquire)) {
    if (monotonic_ms() >= deadline) return;
    sleep_ms(1);
  }
  signal_job_ = SignalJob{job, arg};
  const uint64_t ticket = signal_jobs_asked_.fetch_add(1, std::memory_order_acq_rel) + 1;
  wake();
  while (signal_jobs_done_.load(std::memory_order_acquire) < ticket && monotonic_ms() < deadline)
    sleep_ms(1);
}

void StreamWriter::drain(long stall_ms) {
  ensure_thread();
  const uint64_t target = pushed_.load(std::memory_order_acquire);
  // As long as the writer makes progress: a disk that writes back gigabytes (a wheel unpacking
  // beside the run) can hold write() for seconds, and a fixed cap lost the streams' last bytes.
  uint64_t seen = written_.load(std::memory_order_acquire);
  long stalled_ms = 0;
  while (seen < target && stalled_ms < stall_ms) {
    sleep_ms(1);
    const uint64_t now = written_.load(std::memory_order_acquire);
    stalled_ms = now == seen ? stalled_ms + 1 : 0;
    seen = now;
  }
}

size_t StreamWriter::crash_flush(StreamBuffer* stream, size_t from) {
  // On the writer thread, or with none: nothing else writes these files now.
  write_pending();
  if (!stream || stream->fd < 0) return from;
  const size_t committed = stream->committed.load(std::memory_order_acquire);
  if (committed <= from) return from;
  write_all(stream->fd, stream->bytes.data() + from, committed - from);
  return committed;
}

void StreamWriter::append_now(StreamBuffer* stream, const char* bytes, size_t n) {
  if (stream && stream->fd >= 0) write_all(stream->fd, bytes, n);
}

size_t StreamWriter::freeze_and_save(const std::vector<StreamBuffer*>& streams, StreamBuffer* own,
                                     const std::function<void(size_t, long)>& settle,
                                     long budget_ms, const std::function<void(size_t)>& saved) {
  g_streams_frozen.store(true);
  // By the clock, over all streams: on a loaded host each 1 ms sleep takes several, and the
  // waits of a few streams must not use up the handler's bound before anything is written.
  const int64_t deadline = monotonic_ms() + budget_ms;
  for (size_t k = 0; k < streams.size(); ++k) {
    StreamBuffer* s = streams[k];
    if (!s || s == own) continue;
    const int64_t leave_by = std::min(deadline, monotonic_ms() + 200);
    while (s->writing.load() && monotonic_ms() < leave_by) sleep_ms(1);
    if (s->writing.load()) continue;
    const int64_t left = deadline - monotonic_ms();
    if (left > 0) settle(k, long(left));  // else saved without its held records
    crash_flush(s);
    if (saved) saved(k);
  }
  return crash_flush(own);
}

void StreamWriter::reset_after_fork() {
  head_.store(nullptr);  // the parent writes its own chunks; leaking the child's copy is fine
  pushed_.store(0);
  written_.store(0);
  signal_jobs_asked_.store(0);
  signal_jobs_done_.store(0);
  signal_job_claimed_.store(false);
  started_.store(false);
  deferred_stream_.store(nullptr);
  raised_again_.store(false);
  writer_idle_.store(false);
}

}  // namespace detaudit::hooks
