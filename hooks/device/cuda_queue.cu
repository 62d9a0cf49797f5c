#include <cuda_runtime.h>

#include <cstring>

#include "device/completion_word.h"
#include "device/cuda_queue.h"

namespace detaudit::device {

std::unique_ptr<CudaQueue> CudaQueue::create(int slots, Kernel kernel, std::string* error) {
  std::unique_ptr<CudaQueue> q(new CudaQueue());
  q->slots_ = slots;
  q->kernel_ = kernel;
  const size_t bytes = size_t(slots) * kMaxBatch * sizeof(lanes::LaneResult);
  cudaError_t rc = cudaGetDevice(&q->device_);
  // Made once, at the first CUDA tensor: these calls may synchronize, the ones per op never do.
  if (rc == cudaSuccess)
    rc = cudaHostAlloc(reinterpret_cast<void**>(&q->host_), bytes, cudaHostAllocMapped);
  if (rc == cudaSuccess)
    rc = cudaHostGetDevicePointer(reinterpret_cast<void**>(&q->results_), q->host_, 0);
  if (rc == cudaSuccess)
    rc = cudaMalloc(reinterpret_cast<void**>(&q->scratch_), size_t(slots) * kSlotScratchBytes);
  // The fused kernel's counters start at zero, and every launch leaves them there.
  if (rc == cudaSuccess && kernel == Kernel::kFused)
    rc = cudaMemset(q->scratch_, 0, size_t(slots) * kSlotScratchBytes);
  if (rc == cudaSuccess && kernel == Kernel::kFused) {
    const size_t words = size_t(slots) * kWordStride * sizeof(uint64_t);
    void* host = nullptr;
    rc = cudaHostAlloc(&host, words, cudaHostAllocMapped);
    if (rc == cudaSuccess) {
      std::memset(host, 0, words);
      q->done_host_ = static_cast<volatile uint64_t*>(host);
      rc = cudaHostGetDevicePointer(reinterpret_cast<void**>(&q->done_device_), host, 0);
    }
    q->seq_ = new uint64_t[size_t(slots)]();
    q->streams_ = new void*[size_t(slots)]();
  }
  if (rc == cudaSuccess) q->events_ = new void*[size_t(slots)]();
  for (int s = 0; rc == cudaSuccess && kernel == Kernel::kTwoPass && s < slots; ++s) {
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
  if (done_host_) cudaFreeHost(const_cast<uint64_t*>(done_host_));
  delete[] seq_;
  delete[] streams_;
}

bool CudaQueue::enqueue(const DigestJob* jobs, int n, void* stream, int slot) {
  auto s = static_cast<cudaStream_t>(stream);
  const bool fused = kernel_ == Kernel::kFused;
  const size_t scratch_bytes = CudaQueue::scratch_bytes(kernel_, jobs, n);
  calls_.fetch_add(uint64_t(calls_for(kernel_, scratch_bytes)), std::memory_order_relaxed);
  // The slot's own scratch (free again once its launch completed, when the ring hands the slot
  // out anew); a larger launch's from the stream-ordered allocator, with no synchronization.
  void* scratch = scratch_ + size_t(slot) * kSlotScratchBytes;
  const bool own_scratch = scratch_bytes > kSlotScratchBytes;
  if (own_scratch && cudaMallocAsync(&scratch, scratch_bytes, s) != cudaSuccess) return false;
  if (own_scratch && fused && cudaMemsetAsync(scratch, 0, kCounterBytes, s) != cudaSuccess) {
    cudaFreeAsync(scratch, s);
    return false;
  }
  // The kernels write the results where the host reads them (mapped pinned memory): no copy.
  lanes::LaneResult* results = results_ + size_t(slot) * kMaxBatch;
  bool ok;
  if (fused) {
    streams_[slot] = stream;
    ok = launch_fused_digest(jobs, n, scratch, results, done_device_ + size_t(slot) * kWordStride,
                             ++seq_[slot], stream) == 0;
  } else {
    ok = launch_lane_digest(jobs, n, scratch, results, stream) == 0;
  }
  if (own_scratch) cudaFreeAsync(scratch, s);
  if (fused) return ok;
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
  if (kernel_ == Kernel::kTwoPass)
    return cudaEventSynchronize(static_cast<cudaEvent_t>(events_[slot])) == cudaSuccess;
  auto stream = static_cast<cudaStream_t>(streams_[slot]);
  auto ask = [stream] {
    // Never a query of a stream the program has begun capturing since (or, for the legacy
    // stream, while a blocking stream captures): it would invalidate the program's capture.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
      cudaGetLastError();  // not sticky: cleared
      return StreamState::kBusy;
    }
    if (capture != cudaStreamCaptureStatusNone) return StreamState::kBusy;
    const cudaError_t rc = cudaStreamQuery(stream);
    // A stream the program destroyed still runs what it was given: the word will come.
    if (rc == cudaErrorNotReady || rc == cudaErrorInvalidResourceHandle) {
      if (rc == cudaErrorInvalidResourceHandle) cudaGetLastError();  // not sticky: cleared
      return StreamState::kBusy;
    }
    return rc == cudaSuccess ? StreamState::kIdle : StreamState::kFailed;
  };
  // A launch is microseconds behind; the stream is asked only when its word is long late (a
  // kernel that faulted never writes it).
  return wait_for_word(done_host_ + size_t(slot) * kWordStride, seq_[slot], ask,
                       std::chrono::milliseconds(100));
}

}  // namespace detaudit::device
