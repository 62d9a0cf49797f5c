#include <cuda_runtime.h>

#include "device/cuda_queue.h"

namespace detaudit::device {

std::unique_ptr<CudaQueue> CudaQueue::create(int slots, std::string* error) {
  std::unique_ptr<CudaQueue> q(new CudaQueue());
  q->slots_ = slots;
  const size_t bytes = size_t(slots) * kMaxBatch * sizeof(lanes::LaneResult);
  cudaError_t rc = cudaGetDevice(&q->device_);
  // Made once, at the first CUDA tensor: these calls may synchronize, the ones per op never do.
  if (rc == cudaSuccess)
    rc = cudaHostAlloc(reinterpret_cast<void**>(&q->host_), bytes, cudaHostAllocMapped);
  if (rc == cudaSuccess)
    rc = cudaHostGetDevicePointer(reinterpret_cast<void**>(&q->results_), q->host_, 0);
  if (rc == cudaSuccess)
    rc = cudaMalloc(reinterpret_cast<void**>(&q->scratch_), size_t(slots) * kSlotScratchBytes);
  if (rc == cudaSuccess) q->events_ = new void*[size_t(slots)]();
  for (int s = 0; rc == cudaSuccess && s < slots; ++s) {
    // Blocking sync: the collector sleeps on an event rather than spinning a core.
    rc = cudaEventCreateWithFlags(reinterpret_cast<cudaEvent_t*>(&q->events_[s]),
                                  cudaEventDisableTiming | cudaEventBlockingSync);
  }
  if (rc == cudaSuccess)
    rc = cudaEventCreateWithFlags(reinterpret_cast<cudaEvent_t*>(&q->order_event_),
                                  cudaEventDisableTiming);
  if (rc != cudaSuccess) {
    *error = std::string("device digest buffers: ") + cudaGetErrorString(rc);
    return nullptr;
  }
  return q;
}

CudaQueue::~CudaQueue() {
  if (events_)
    for (int s = 0; s < slots_; ++s)
      if (events_[s]) cudaEventDestroy(static_cast<cudaEvent_t>(events_[s]));
  delete[] events_;
  if (order_event_) cudaEventDestroy(static_cast<cudaEvent_t>(order_event_));
  if (scratch_) cudaFree(scratch_);
  if (host_) cudaFreeHost(host_);
}

bool CudaQueue::enqueue(const DigestJob* jobs, int n, void* stream, int slot) {
  auto s = static_cast<cudaStream_t>(stream);
  const size_t scratch_bytes = lane_scratch_bytes(jobs, n);
  calls_.fetch_add(uint64_t(calls_for(scratch_bytes)), std::memory_order_relaxed);
  // The slot's own scratch (free again once its launch completed, when the ring hands the slot
  // out anew); a larger launch's from the stream-ordered allocator, with no synchronization.
  void* scratch = scratch_ + size_t(slot) * kSlotScratchBytes;
  const bool own_scratch = scratch_bytes > kSlotScratchBytes;
  if (own_scratch && cudaMallocAsync(&scratch, scratch_bytes, s) != cudaSuccess) return false;
  // The kernels write the results where the host reads them (mapped pinned memory): no copy.
  bool ok = launch_lane_digest(jobs, n, scratch, results_ + size_t(slot) * kMaxBatch, stream) == 0;
  if (own_scratch) cudaFreeAsync(scratch, s);
  // Recorded even when something failed, so that wait() never waits on a stale event.
  ok = cudaEventRecord(static_cast<cudaEvent_t>(events_[slot]), s) == cudaSuccess && ok;
  return ok;
}

bool CudaQueue::make_wait(void* waiting, void* stream) {
  std::lock_guard<std::mutex> lock(order_mu_);
  auto event = static_cast<cudaEvent_t>(order_event_);
  // The wait takes the event as recorded now: the next record may reuse it at once.
  return cudaEventRecord(event, static_cast<cudaStream_t>(stream)) == cudaSuccess &&
         cudaStreamWaitEvent(static_cast<cudaStream_t>(waiting), event, 0) == cudaSuccess;
}

bool CudaQueue::wait(int slot) {
  // While the program captures a CUDA graph in the default (global) mode, a synchronizing call
  // from any thread of it would invalidate the capture; the collector's own are safe (it waits
  // only for launches made outside captures), and say so.
  static thread_local const bool relaxed = [] {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    return cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
  }();
  (void)relaxed;
  return cudaEventSynchronize(static_cast<cudaEvent_t>(events_[slot])) == cudaSuccess;
}

}  // namespace detaudit::device
