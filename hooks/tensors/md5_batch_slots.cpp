#include "tensors/md5_batch_slots.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace detaudit::hooks {

namespace {
std::atomic<uint64_t> g_runs{0}, g_tensors{0}, g_on_digest_thread{0}, g_on_intra_op_threads{0};

void finish_slot(Md5BatchSlots::Slot& s) {
  g_runs.fetch_add(1, std::memory_order_relaxed);
  g_tensors.fetch_add(s.pending.size(), std::memory_order_relaxed);
  for (size_t i = 0; i < s.pending.size(); ++i) s.pending[i]->complete(s.batch.result(i));
}

void run_slot(Md5BatchSlots::Slot& s) {
  s.batch.run();
  finish_slot(s);
}

// The process's digest thread: runs the batches that op threads hand it, in turn. Signals are
// blocked there, so that a stop signal's handler never runs on it and waits for itself.
class DigestThread {
 public:
  // This process's: a forked child gets a fresh one (the parent's thread is not there, and its
  // lock may have been held at the fork).
  static DigestThread* instance() {
    static std::atomic<DigestThread*> current{nullptr};
    DigestThread* t = current.load(std::memory_order_acquire);
    const pid_t pid = ::getpid();
    while (!t || t->pid_ != pid) {
      // Never destroyed: exit handlers may still hand it batches. No lock: one held at a fork
      // would stay held in the child.
      auto* made = new DigestThread(pid);
      if (current.compare_exchange_strong(t, made, std::memory_order_acq_rel)) return made;
      delete made;  // another thread of this process made one first: t is now that one
    }
    return t;
  }

  // False if no thread could be started, or its queue is full: the caller runs the batch itself.
  bool push(Md5BatchSlots::Slot* s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_) {
      try {
        std::thread([this] { loop(); }).detach();
      } catch (const std::exception&) {
        return false;
      }
      started_ = true;
    }
    if (count_ == queue_.size()) return false;
    queue_[(head_ + count_++) % queue_.size()] = s;
    cv_.notify_one();
    return true;
  }

 private:
  explicit DigestThread(pid_t pid) : pid_(pid) {}

  void loop() {
    pthread_setname_np(pthread_self(), "detaudit-md5");
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    for (;;) {
      Md5BatchSlots::Slot* s;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return count_ > 0; });
        s = queue_[head_];
        head_ = (head_ + 1) % queue_.size();
        --count_;
      }
      run_slot(*s);
      g_on_digest_thread.fetch_add(1, std::memory_order_relaxed);
      s->busy.store(false, std::memory_order_release);
    }
  }

  const pid_t pid_;
  std::mutex mu_;
  std::condition_variable cv_;
  // A fixed ring, one batch in flight per op thread at most: nothing here allocates, so the
  // digest thread's pace never moves the program's allocations.
  std::array<Md5BatchSlots::Slot*, 256> queue_{};
  size_t head_ = 0, count_ = 0;
  bool started_ = false;
};

}  // namespace

std::string md5_batch_status() {
  const uint64_t runs = g_runs.load(std::memory_order_relaxed);
  if (runs == 0) return "";
  return "md5 batches: " + std::to_string(runs) + " runs, " +
         std::to_string(g_tensors.load(std::memory_order_relaxed)) + " tensors, " +
         std::to_string(g_on_digest_thread.load(std::memory_order_relaxed)) +
         " runs on the digest thread, " +
         std::to_string(g_on_intra_op_threads.load(std::memory_order_relaxed)) +
         " on the intra-op threads";
}

void forget_md5_batch_status() {
  for (auto* counter : {&g_runs, &g_tensors, &g_on_digest_thread, &g_on_intra_op_threads})
    counter->store(0, std::memory_order_relaxed);
}

uint8_t* Md5BatchSlots::reserve(size_t n) {
  if (!slots_[filling_].batch.has_room(n)) hand_off(slots_[filling_]);
  return slots_[filling_].batch.reserve(n);
}

std::shared_ptr<PendingDigest> Md5BatchSlots::commit(trace::Dtype dtype, bool with_stats) {
  Slot& s = slots_[filling_];
  s.batch.commit(dtype, with_stats);
  s.pending.push_back(std::make_shared<PendingDigest>(dtype, with_stats));
  auto digest = s.pending.back();
  if (s.batch.full()) hand_off(s);
  return digest;
}

bool Md5BatchSlots::run_on_intra_op_threads(Slot& s) {
  const size_t threads = threads_.available ? threads_.available() : 1;
  if (threads < 2) return false;
  s.batch.run(threads_.parallel, threads);
  finish_slot(s);
  g_on_intra_op_threads.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void Md5BatchSlots::hand_off(Slot& s) {
  // The slot filled next must be back from the digest thread first.
  reclaim(slots_[filling_ ^ 1]);
  if (!run_on_intra_op_threads(s)) {
    s.busy.store(true, std::memory_order_release);
    if (!DigestThread::instance()->push(&s)) {
      run_slot(s);
      s.busy.store(false, std::memory_order_release);
    }
  }
  filling_ ^= 1;
}

void Md5BatchSlots::submit_if_idle() {
  Slot& other = slots_[filling_ ^ 1];
  if (slots_[filling_].pending.empty() || other.busy.load(std::memory_order_acquire)) return;
  hand_off(slots_[filling_]);
}

bool Md5BatchSlots::reclaim(Slot& s, long max_wait_ms) {
  if (s.busy.load(std::memory_order_acquire)) {
    // The digest thread takes a batch at once and hashes it in well under a millisecond: a wait
    // here is short, and rare (this thread filled a whole batch meanwhile).
    const auto start = std::chrono::steady_clock::now();
    while (s.busy.load(std::memory_order_acquire)) {
      if (max_wait_ms >= 0 &&
          std::chrono::steady_clock::now() - start > std::chrono::milliseconds(max_wait_ms))
        return false;
      sched_yield();
    }
  }
  s.pending.clear();
  s.batch.clear();
  return true;
}

bool Md5BatchSlots::run(long max_wait_ms) {
  if (!reclaim(slots_[filling_ ^ 1], max_wait_ms)) return false;
  Slot& s = slots_[filling_];
  if (!s.pending.empty()) {
    run_slot(s);
    s.pending.clear();
    s.batch.clear();
  }
  return true;
}

void Md5BatchSlots::discard() {
  for (Slot& s : slots_) {
    s.busy.store(false);
    s.pending.clear();
    s.batch.clear();
  }
  filling_ = 0;
}

}  // namespace detaudit::hooks
