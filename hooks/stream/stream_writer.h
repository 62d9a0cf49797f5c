// hooks/stream: an op's records on their way to the file: each thread's buffer, the records held
// for their digests, the writer thread that writes them and saves them on a signal.
//
// Moves finished trace bytes from op threads to disk without a lock or a write on the op thread.
//
// Each recording thread appends whole records to its own buffer and hands full buffers over as
// chunks through a lock-free stack; one background thread writes them to the stream's file.
// A signal's handler has the writer thread save what the buffers hold (run_from_signal).
//
// Chunks live in their own memory mappings, never in malloc's heap: handovers follow the clock
// and the writer frees when it is done, so in the heap they would move the program's tensors
// from run to run, and a kernel whose result depends on alignment would follow them.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "util/check.h"

namespace detaudit::hooks {

// Set once a stop signal's save freezes every buffer: from then on no thread changes its own.
inline std::atomic<bool> g_streams_frozen{false};

struct StreamBuffer;
// Raises the stop signal put off until the buffer's thread left it (StreamWriter::
// defer_stop_signal); its own leave_write calls it.
void raise_deferred_stop(StreamBuffer* stream);
// Its thread entered its buffer while its stop signal was put off: from now, the inside bound.
void stop_deferred_while_inside();

// One stream's file and the bytes its thread has not handed over yet.
struct StreamBuffer {
  int fd = -1;
  std::string bytes;                    // whole records only, at chunk boundaries
  std::atomic<size_t> committed{0};     // bytes.size() after the last whole record
  std::atomic<bool> writing{false};     // its thread is appending or handing over
  std::atomic<int> deferred_signal{0};  // StreamWriter::defer_stop_signal

  // Around the op thread's changes to `bytes`; false once the streams are frozen. Both sides
  // are sequentially consistent: either the handler sees `writing` and waits, or the thread
  // sees the freeze and leaves the buffer alone.
  bool enter_write() {
    DETAUDIT_DCHECK(!writing.load(std::memory_order_relaxed),
                    "a stream's buffer is entered by its one op thread, never twice");
    writing.store(true);
    if (!g_streams_frozen.load()) {
      if (deferred_signal.load(std::memory_order_relaxed) != 0) stop_deferred_while_inside();
      return true;
    }
    writing.store(false);
    return false;
  }
  void leave_write() {
    writing.store(false, std::memory_order_release);
    if (deferred_signal.load(std::memory_order_relaxed) != 0) raise_deferred_stop(this);
  }
};

class StreamWriter {
 public:
  static StreamWriter& instance();

  // Starts the writer thread (when a stream opens: a deterministic point of the program).
  void start() { ensure_thread(); }
  // Hands the buffer's bytes to the writer thread; the buffer is left empty, its capacity kept.
  void hand_over(StreamBuffer* stream);
  // Writes everything handed over so far and waits for it (at exit, never on the op path); gives
  // up only when no chunk was written for `stall_ms` (a dead disk must not hang the program).
  void drain(long stall_ms = 60000);
  // From a signal handler: runs job(arg) on the writer thread and waits for it, at most
  // `max_wait_ms`; here when there is no writer thread, or this is it. The saving allocates, and
  // the handler's thread may have been stopped inside malloc, holding its lock; the writer
  // thread blocks signals, so it never is. Bounded: a program told to stop must stop. `arg`
  // must outlive the job; after a time-out the caller is expected to end the process.
  void run_from_signal(void (*job)(void*), void* arg, long max_wait_ms);
  // Within such a job: what was handed over, then the stream's committed bytes from `from` on.
  // Returns the offset written up to, the `from` of a later call once more records committed.
  size_t crash_flush(StreamBuffer* stream, size_t from = 0);
  // Within such a job, after crash_flush: bytes written straight after the stream's (its END).
  void append_now(StreamBuffer* stream, const char* bytes, size_t n);
  // The first write that failed (a full disk): its errno and file, "" if none did. The writer
  // goes on dropping that stream's bytes; the program goes on.
  std::string first_write_error() const;
  // Within such a job: freeze every stream, wait (briefly) for threads inside a write to leave
  // it, then save each buffer's committed bytes. `settle(i, max_wait_ms)` runs first for each
  // stream i whose thread is out of it for good, while `budget_ms` lasts, and `saved(i)` after
  // its bytes are written. `own`, the buffer of the thread the signal stopped, is saved as it
  // stands, unsettled: settling frees memory of that thread's malloc arena, whose lock it may
  // hold. Returns the offset own was written up to.
  size_t freeze_and_save(const std::vector<StreamBuffer*>& streams, StreamBuffer* own,
                         const std::function<void(size_t, long)>& settle, long budget_ms,
                         const std::function<void(size_t)>& saved = nullptr);
  // How long a stop signal put off waits for its thread to leave its buffer: `inside_ms` when
  // the thread is inside it (the rest of a record), `outside_ms` when it is not (until its next
  // record).
  struct StopBounds {
    long outside_ms;
    long inside_ms;
  };
  // From a stop signal's handler (SIGTERM, SIGINT) on the thread of `own`, whose stream is open:
  // the signal is put off until that thread next leaves its buffer, a whole record later
  // (leave_write raises it again), and true is returned. Saved there, the thread is at a known
  // point: not inside malloc holding its arena's lock, which the save's freeing needs, and not
  // halfway through a record, so the records it holds for their digests are saved too. Should
  // it not get there within its bound (a thread waiting in a collective or for data), the
  // writer thread raises the signal on it (thread id `tid`) again, and that one is saved at
  // once, with what is whole. A thread that enters its buffer after the signal (its END,
  // written at exit) has the inside bound from then, once: raised at the outside bound, it
  // would be saved mid-record, its stream without that END. A stop signal meanwhile waits with
  // the one put off, or once that one's bound has passed, is saved at once (should the writer
  // thread be stuck in a write). Nothing is put off while the writer has been in one write for
  // over kWriterStuckMs.
  bool defer_stop_signal(StreamBuffer* own, int sig, pid_t tid, StopBounds bounds);
  static constexpr int64_t kWriterStuckMs = 1000;
  // In a forked child: forget the parent's queue and thread.
  void reset_after_fork();
  // The writer thread's rounds so far; an idle one makes about one each idle_ms.
  uint64_t rounds() const { return rounds_.load(std::memory_order_relaxed); }
  // The longest an idle writer sleeps before its next round (tests make it long: a wake()
  // missed then shows). kIdleMs by default.
  void set_idle_ms(long ms) { idle_ms_.store(ms); }
  static constexpr long kIdleMs = 100;  // its beat stays far fresher than kWriterStuckMs

 private:
  // One mapping: this header, then `size` bytes.
  struct Chunk {
    int fd;
    size_t size;
    Chunk* next;
    char* data() { return reinterpret_cast<char*>(this + 1); }
  };
  static void release(Chunk* chunk);
  StreamWriter() = default;
  void write_all(int fd, const char* p, size_t n);  // remembers the first failure
  void ensure_thread();
  void run();
  // The writer thread, out of work: waits until wake(), for at most idle_ms_, and no longer
  // than the bound of a stop signal put off.
  void idle();
  // Tells an idle writer thread there is work: a chunk, a signal's job, a stop put off.
  // Async-signal-safe.
  void wake();
  size_t write_pending();
  void raise_overdue_stop();
  friend void raise_deferred_stop(StreamBuffer* stream);
  friend void stop_deferred_while_inside();

  std::atomic<Chunk*> head_{nullptr};
  std::atomic<uint64_t> pushed_{0}, written_{0};
  // run_from_signal's job: written by the handler holding `claimed`, published by `asked`.
  struct SignalJob {
    void (*run)(void*);
    void* arg;
  };
  SignalJob signal_job_{nullptr, nullptr};
  std::atomic<bool> signal_job_claimed_{false};
  std::atomic<uint64_t> signal_jobs_asked_{0}, signal_jobs_done_{0};
  std::atomic<bool> started_{false};
  std::atomic<int> write_errno_{0};
  std::atomic<int> write_error_fd_{-1};
  // The stop signal put off (defer_stop_signal): whose buffer, its thread, and until when.
  std::atomic<StreamBuffer*> deferred_stream_{nullptr};
  std::atomic<pid_t> deferred_tid_{0};
  std::atomic<int64_t> deferred_until_ms_{0};
  std::atomic<long> deferred_inside_ms_{0};  // the inside bound, while not given yet
  std::atomic<int64_t> writer_beat_ms_{0};   // when the writer thread last began a round
  std::atomic<bool> raised_again_{false};    // the next stop signal is the one put off: saved now
  // The futex an idle writer waits on: bumped by wake(), which calls into the kernel only
  // while writer_idle_ says the writer may be asleep.
  std::atomic<uint32_t> wake_seq_{0};
  static_assert(sizeof(wake_seq_) == 4 && std::atomic<uint32_t>::is_always_lock_free,
                "the futex syscall takes the atomic's address as a plain 32-bit word");
  std::atomic<bool> writer_idle_{false};
  std::atomic<long> idle_ms_{kIdleMs};
  std::atomic<uint64_t> rounds_{0};
};

// Writes all of [p, p + n) to fd; false with errno set when the disk refused some of it.
bool write_fully(int fd, const char* p, size_t n);

// A clock and a sleep that a signal handler may use.
int64_t monotonic_ms();
void sleep_ms(long ms);

}  // namespace detaudit::hooks
