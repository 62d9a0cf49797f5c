// The DeviceQueue of a CUDA device: each ring slot has room for a launch's results in mapped
// pinned memory, which the kernel writes and the host reads, leaf scratch in device memory, and
// an event. All of it is allocated once per device. The op's thread enqueues the kernels and the
// event on the op's stream; the collector thread sleeps on the event.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "device/digest_pipeline.h"

namespace detaudit::device {

class CudaQueue : public DeviceQueue {
 public:
  // For the current device; null, with *error set, when its buffers cannot be made.
  static std::unique_ptr<CudaQueue> create(int slots, std::string* error);
  ~CudaQueue() override;

  // Leaf scratch per slot: a launch of more leaves (more than 16 MiB of tensors) takes its
  // scratch from the stream-ordered allocator instead, two more CUDA calls.
  static constexpr size_t kSlotScratchBytes = size_t(256) << 10;

  // The CUDA calls enqueue() makes for a launch whose leaves need `scratch_bytes`: the leaf and
  // tensor kernels (the tensor kernel alone without leaves), the event, and the stream-ordered
  // allocation and free of scratch beyond the slot's.
  static int calls_for(size_t scratch_bytes) {
    return (scratch_bytes ? 2 : 1) + 1 + (scratch_bytes > kSlotScratchBytes ? 2 : 0);
  }

  int slots() const override { return slots_; }
  uint64_t device_calls() const override { return calls_.load(std::memory_order_relaxed); }
  bool enqueue(const DigestJob* jobs, int n, void* stream, int slot) override;
  bool wait(int slot) override;
  const lanes::LaneResult* results(int slot) override { return host_ + size_t(slot) * kMaxBatch; }
  bool make_wait(void* waiting, void* stream) override;
  int device() const { return device_; }

 private:
  CudaQueue() = default;
  int slots_ = 0;
  int device_ = -1;
  lanes::LaneResult* host_ = nullptr;     // pinned and mapped: the kernel writes it
  lanes::LaneResult* results_ = nullptr;  // host_ as the device sees it
  uint8_t* scratch_ = nullptr;            // device memory, kSlotScratchBytes per slot
  std::atomic<uint64_t> calls_{0};        // CUDA calls made by enqueue
  void** events_ = nullptr;               // cudaEvent_t per slot
  void* order_event_ = nullptr;           // make_wait's, one wait at a time
  std::mutex order_mu_;
};

}  // namespace detaudit::device
