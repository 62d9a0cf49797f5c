// The pipeline's device part on the CPU, for tests of the recorder's path without a GPU
// (DETAUDIT_DEVICE_QUEUE=host): each batch is digested when it is enqueued, as the kernel reads
// it on the op's stream, and completes late, so that records are really held. A small ring, so
// that it fills. It takes what CudaQueue takes with DETAUDIT_DEVICE_KERNEL's kernel (strided
// views with the fused one) and counts the CUDA calls CudaQueue would make. Torch-free: the
// unit tests check its digests against the device digest's reference.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

#include "device/cuda_queue.h"
#include "device/digest_pipeline.h"

namespace detaudit::device {

class HostQueue : public DeviceQueue {
 public:
  explicit HostQueue(CudaQueue::Kernel kernel = CudaQueue::kernel_from_env()) : kernel_(kernel) {}

  int slots() const override { return int(results_.size()); }
  bool enqueue(const DigestJob* jobs, int n, void* stream, int slot) override;
  // As CudaQueue with the same kernel.
  bool reads_strided() const override { return kernel_ == CudaQueue::Kernel::kFused; }
  bool wait(int slot) override;  // completes late: 100 us after it is asked
  const lanes::LaneResult* results(int slot) override { return results_[size_t(slot)].data(); }
  uint64_t device_calls() const override { return calls_.load(std::memory_order_relaxed); }

 private:
  const CudaQueue::Kernel kernel_;
  std::vector<uint8_t> staging_;  // enqueue runs under the pipeline's lock: one at a time
  std::atomic<uint64_t> calls_{0};
  std::array<std::array<lanes::LaneResult, kMaxBatch>, 4> results_{};
};

}  // namespace detaudit::device
