// hooks/device: the device digest on a GPU: batches launched behind the ops, the kernel, and the
// queue a test can fake. Torch-free.
//
// Device digests without blocking the op's thread. The op's thread enqueues a batch's digest on
// the op's stream, right behind the op, into a slot of a small ring; a collector thread waits for
// the slots in the order they were filled and hands each batch's results to its completion. The
// op's thread waits only when every slot is busy, for the oldest one, and that is counted.
//
// Torch-free and CUDA-free: a DeviceQueue does the device's part (cuda_queue.cu on a GPU; the
// unit tests drive a fake one whose completions they control).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "device/lane_kernel.h"

namespace detaudit::device {

class DeviceQueue {
 public:
  virtual ~DeviceQueue() = default;
  virtual int slots() const = 0;
  // Enqueues the digest of jobs[0..n) into `slot` on `stream` (a cudaStream_t), behind what the
  // stream already holds. Never waits for the device. False when the device refused it (the
  // results are then absent).
  virtual bool enqueue(const DigestJob* jobs, int n, void* stream, int slot) = 0;
  // Blocks until slot's batch is done (the collector's thread only). False when the device
  // reported an error instead: the results are then absent.
  virtual bool wait(int slot) = 0;
  // slot's n results, once wait() returned.
  virtual const lanes::LaneResult* results(int slot) = 0;
  // The device API calls enqueue() made so far (CUDA calls on a GPU; none on the host).
  virtual uint64_t device_calls() const { return 0; }
  // Whether it digests strided jobs in place (DigestJob::strided); else a view is made
  // contiguous first.
  virtual bool reads_strided() const { return false; }
  // Makes `waiting` (a cudaStream_t) wait for what `stream` holds so far: a write on another
  // stream than a digest's must come after it. Nothing to do where there is one queue order.
  virtual bool make_wait(void* waiting, void* stream) {
    (void)waiting;
    (void)stream;
    return true;
  }
};

class DigestPipeline {
 public:
  // Runs on the collector thread, in submission order: results is null when the batch could not
  // be enqueued, else one LaneResult per job.
  using Completion = std::function<void(const lanes::LaneResult* results, int n)>;

  explicit DigestPipeline(DeviceQueue* queue);
  ~DigestPipeline();  // drains
  DigestPipeline(const DigestPipeline&) = delete;
  DigestPipeline& operator=(const DigestPipeline&) = delete;

  // From an op's thread: enqueues on `stream` now, returns without waiting unless the ring is full.
  void submit(const std::vector<DigestJob>& jobs, void* stream, Completion done);
  // The same from a stop signal's save: never blocks on the lock (the interrupted thread may
  // hold it) nor on a full ring for more than `ms` milliseconds. False, with nothing enqueued
  // and `done` not called, when it gave up.
  bool submit_within(const std::vector<DigestJob>& jobs, void* stream, Completion done, int ms);
  // Waits until every batch submitted so far has completed (at exit, at a thread's end).
  void drain();
  // The same from a stop signal's handler: never blocks on the lock (the interrupted thread may
  // hold it), gives up after `ms` milliseconds. True if everything completed.
  bool drain_for(int ms);
  // How often submit() found every slot busy and waited for the oldest. Never blocks.
  uint64_t ring_full_waits() const { return full_waits_.load(std::memory_order_relaxed); }
  uint64_t batches() const { return submitted_.load(std::memory_order_relaxed); }

 private:
  struct InFlight {
    int slot;
    int n;
    bool enqueued;
    Completion done;
  };
  void collect();
  // Takes the next slot and enqueues; mu_ held, next slot free.
  void enqueue_locked(const std::vector<DigestJob>& jobs, void* stream, Completion done);

  DeviceQueue* queue_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::deque<InFlight> in_flight_;  // oldest first
  std::vector<bool> busy_;
  int next_slot_ = 0;
  uint64_t completed_ = 0;
  // Read without the lock too: a signal handler may have interrupted the thread that holds it.
  std::atomic<uint64_t> submitted_{0}, full_waits_{0};
  bool stopping_ = false;
  std::thread collector_;
};

}  // namespace detaudit::device
