// CUDA tensors digested on their own device (device/): the process's pipelines, one per device,
// and a thread's batch of tensors waiting to be enqueued on the op's stream. Built without the
// kernels (a CPU torch, or no nvcc), no device is available and CUDA tensors take the host copy.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "device/lane_kernel.h"
#include "stream/pending_records.h"

namespace detaudit::hooks {

// Whether t's device digest goes through a pipeline (makes it at first use): a CUDA tensor
// where the kernels are built; with DETAUDIT_DEVICE_QUEUE=host, for tests without a GPU, a CPU
// tensor through a queue on the host that completes late.
bool digests_on_device(const at::Tensor& t);
// Waits for every digest enqueued so far (at exit, at a thread's end).
void drain_device_digests();
// The same from a stop signal's handler: at most `ms` milliseconds, never blocking on a lock.
void drain_device_digests_for(int ms);
// A line for the .status file ("" when no device digest ran): batches, ring-full waits, failures.
std::string device_digest_status();

// One thread's tensors for its next launch: an op's inputs, or its outputs.
class DeviceBatch {
 public:
  // t's digest, computed on its device on the current stream by the next submit(). A
  // non-contiguous t is made contiguous on that stream now; the batch keeps what it reads alive
  // until it is enqueued, so that no later op can reuse the memory first.
  std::shared_ptr<PendingDigest> add(const at::Tensor& t, bool with_stats);
  // Enqueues the batch behind what its stream holds: after an op's inputs are captured (before
  // the op runs) and after its outputs. Never waits for the device.
  void submit();
  bool empty() const { return jobs_.empty(); }

 private:
  int device_ = -1;
  void* stream_ = nullptr;
  std::vector<device::DigestJob> jobs_;
  std::vector<at::Tensor> held_;
  std::vector<std::shared_ptr<PendingDigest>> digests_;
};

}  // namespace detaudit::hooks
