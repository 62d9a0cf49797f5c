// The DeviceQueue of a CUDA device: each ring slot has room for a launch's results in mapped
// pinned memory, which the kernel writes and the host reads, scratch in device memory, and a way
// to tell its launch is done. All of it is allocated once per device. Two kernels:
// - fused (DETAUDIT_DEVICE_KERNEL=fused): one kernel whose last block writes the slot's completion
//   word in mapped memory, which the collector polls: one CUDA call a launch;
// - two-pass (the default until a GPU has checked the fused one, docs/gpu.md): a leaf kernel, a
//   group kernel and an event the collector sleeps on: three.
#pragma once

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include "device/digest_pipeline.h"

namespace detaudit::device {

class CudaQueue : public DeviceQueue {
 public:
  enum class Kernel { kTwoPass, kFused };
  // DETAUDIT_DEVICE_KERNEL: "fused" or "two-pass" (the default).
  static Kernel kernel_from_env() {
    const char* v = std::getenv("DETAUDIT_DEVICE_KERNEL");
    return v && std::string(v) == "fused" ? Kernel::kFused : Kernel::kTwoPass;
  }

  // For the current device; null, with *error set, when its buffers cannot be made.
  static std::unique_ptr<CudaQueue> create(int slots, Kernel kernel, std::string* error);
  ~CudaQueue() override;

  // Scratch per slot: a launch that needs more (two-pass: more than 16 MiB of tensors; fused:
  // more than 4,000 groups of 1 MiB) takes it from the stream-ordered allocator instead, two more
  // CUDA calls (three fused: its counters are zeroed).
  static constexpr size_t kSlotScratchBytes = size_t(256) << 10;

  static size_t scratch_bytes(Kernel kernel, const DigestJob* jobs, int n) {
    return kernel == Kernel::kFused ? fused_scratch_bytes(jobs, n) : lane_scratch_bytes(jobs, n);
  }
  // The CUDA calls enqueue() makes for a launch that needs `scratch` bytes of scratch.
  static int calls_for(Kernel kernel, size_t scratch) {
    const bool own = scratch > kSlotScratchBytes;
    // Fused: the kernel, and beyond the slot's scratch its allocation, zeroing and free.
    if (kernel == Kernel::kFused) return 1 + (own ? 3 : 0);
    // The leaf and tensor kernels (the tensor kernel alone without leaves), the event, and the
    // stream-ordered allocation and free of scratch beyond the slot's.
    return (scratch ? 2 : 1) + 1 + (own ? 2 : 0);
  }
  static int calls_for(Kernel kernel, const DigestJob* jobs, int n) {
    return calls_for(kernel, scratch_bytes(kernel, jobs, n));
  }

  int slots() const override { return slots_; }
  uint64_t device_calls() const override { return calls_.load(std::memory_order_relaxed); }
  // Both kernels could; the fused one does, until a GPU has checked it (docs/gpu.md).
  bool reads_strided() const override { return kernel_ == Kernel::kFused; }
  bool enqueue(const DigestJob* jobs, int n, void* stream, int slot) override;
  bool wait(int slot) override;
  const lanes::LaneResult* results(int slot) override { return host_ + size_t(slot) * kMaxBatch; }
  bool make_wait(void* waiting, void* stream) override;
  int device() const { return device_; }
  Kernel kernel() const { return kernel_; }

 private:
  CudaQueue() = default;
  int slots_ = 0;
  int device_ = -1;
  Kernel kernel_ = Kernel::kTwoPass;
  // Fused: a completion word a slot (its own cache line) in mapped pinned memory, the sequence
  // number its launch will write, and the stream it went on (asked when the word is late).
  static constexpr size_t kWordStride = 8;
  volatile uint64_t* done_host_ = nullptr;
  uint64_t* done_device_ = nullptr;
  uint64_t* seq_ = nullptr;
  void** streams_ = nullptr;
  lanes::LaneResult* host_ = nullptr;     // pinned and mapped: the kernel writes it
  lanes::LaneResult* results_ = nullptr;  // host_ as the device sees it
  uint8_t* scratch_ = nullptr;            // device memory, kSlotScratchBytes per slot
  std::atomic<uint64_t> calls_{0};        // CUDA calls made by enqueue
  void** events_ = nullptr;               // cudaEvent_t per slot
  void* order_event_ = nullptr;           // make_wait's, one wait at a time
  std::mutex order_mu_;
};

}  // namespace detaudit::device
