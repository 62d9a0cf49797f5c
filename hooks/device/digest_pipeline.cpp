#include "device/digest_pipeline.h"

#include <chrono>

namespace detaudit::device {

DigestPipeline::DigestPipeline(DeviceQueue* queue)
    : queue_(queue), busy_(size_t(queue->slots()), false), collector_([this] { collect(); }) {}

DigestPipeline::~DigestPipeline() {
  drain();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  collector_.join();
}

void DigestPipeline::submit(const std::vector<DigestJob>& jobs, void* stream, Completion done) {
  std::unique_lock<std::mutex> lock(mu_);
  // Slots are taken in ring order, so the oldest in flight is always the next one to free.
  if (busy_[size_t(next_slot_)]) {
    ++full_waits_;
    changed_.wait(lock, [&] { return !busy_[size_t(next_slot_)]; });
  }
  enqueue_locked(jobs, stream, std::move(done));
  lock.unlock();
  changed_.notify_all();
}

bool DigestPipeline::submit_within(const std::vector<DigestJob>& jobs, void* stream,
                                   Completion done, int ms) {
  for (int waited = 0;; ++waited) {
    if (mu_.try_lock()) {
      if (!busy_[size_t(next_slot_)]) {
        enqueue_locked(jobs, stream, std::move(done));
        mu_.unlock();
        changed_.notify_all();
        return true;
      }
      mu_.unlock();
    }
    if (waited >= ms) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void DigestPipeline::enqueue_locked(const std::vector<DigestJob>& jobs, void* stream,
                                    Completion done) {
  const int slot = next_slot_;
  next_slot_ = (next_slot_ + 1) % queue_->slots();
  busy_[size_t(slot)] = true;
  ++submitted_;
  // Enqueued under the lock: the ring's order is the streams' order, and the collector waits on
  // slots in that order.
  const bool enqueued = queue_->enqueue(jobs.data(), int(jobs.size()), stream, slot);
  in_flight_.push_back({slot, int(jobs.size()), enqueued, std::move(done)});
}

void DigestPipeline::collect() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !in_flight_.empty(); });
    if (in_flight_.empty()) return;  // stopping, nothing left
    InFlight oldest = std::move(in_flight_.front());
    in_flight_.pop_front();
    lock.unlock();
    const bool ok = oldest.enqueued && queue_->wait(oldest.slot);
    oldest.done(ok ? queue_->results(oldest.slot) : nullptr, oldest.n);
    lock.lock();
    busy_[size_t(oldest.slot)] = false;
    ++completed_;
    changed_.notify_all();
  }
}

void DigestPipeline::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = submitted_;
  changed_.wait(lock, [&] { return completed_ >= target; });
}

bool DigestPipeline::drain_for(int ms) {
  uint64_t target = UINT64_MAX;
  for (int waited = 0;; ++waited) {
    if (mu_.try_lock()) {
      if (target == UINT64_MAX) target = submitted_;
      const bool done = completed_ >= target;
      mu_.unlock();
      if (done) return true;
    }
    if (waited >= ms) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace detaudit::device
