#include "tensors/cuda_graphs.h"

#include <atomic>
#include <mutex>
#include <unordered_set>

#ifdef DETAUDIT_DEVICE_DIGEST
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace detaudit::hooks {
namespace {

// Storages are few (a graph's outputs and what it updates in place) and looked up only for CUDA
// tensors being described: a set under a lock.
std::mutex g_mu;
std::unordered_set<const void*> g_written;
std::atomic<bool> g_any{false};

}  // namespace

bool stream_capturing(void* stream) {
#ifdef DETAUDIT_DEVICE_DIGEST
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  // Invalidated counts too: the program's capture failed, and it is still not ours to run on.
  return cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status) == cudaSuccess &&
         status != cudaStreamCaptureStatusNone;
#else
  (void)stream;
  return false;
#endif
}

bool captured_into_cuda_graph(const at::Tensor& t) {
#ifdef DETAUDIT_DEVICE_DIGEST
  if (!t.is_cuda()) return false;
  return stream_capturing(c10::cuda::getCurrentCUDAStream(t.device().index()).stream());
#else
  (void)t;
  return false;
#endif
}

void note_written_by_cuda_graph(const at::Tensor& t) {
  if (!t.has_storage()) return;
  std::lock_guard<std::mutex> lock(g_mu);
  g_written.insert(t.storage().unsafeGetStorageImpl());
  g_any.store(true, std::memory_order_release);
}

bool written_by_cuda_graph(const at::Tensor& t) {
  if (!g_any.load(std::memory_order_acquire) || !t.is_cuda() || !t.has_storage()) return false;
  std::lock_guard<std::mutex> lock(g_mu);
  return g_written.count(t.storage().unsafeGetStorageImpl()) > 0;
}

}  // namespace detaudit::hooks
