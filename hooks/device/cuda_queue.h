// The DeviceQueue of a CUDA device: each ring slot has room for a batch's results in device
// memory and in pinned host memory, and an event behind their copy. The op's thread enqueues the
// kernel, the copy and the event on the op's stream; the collector thread sleeps on the event.
#pragma once

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

  int slots() const override { return slots_; }
  bool enqueue(const DigestJob* jobs, int n, void* stream, int slot) override;
  bool wait(int slot) override;
  const lanes::LaneResult* results(int slot) override { return host_ + size_t(slot) * kMaxBatch; }
  bool make_wait(void* waiting, void* stream) override;
  int device() const { return device_; }

 private:
  CudaQueue() = default;
  int slots_ = 0;
  int device_ = -1;
  lanes::LaneResult* host_ = nullptr;     // pinned: the copies are asynchronous
  lanes::LaneResult* results_ = nullptr;  // device memory, a batch's room per slot
  void** events_ = nullptr;               // cudaEvent_t per slot
  void* order_event_ = nullptr;           // make_wait's, one wait at a time
  std::mutex order_mu_;
};

}  // namespace detaudit::device
