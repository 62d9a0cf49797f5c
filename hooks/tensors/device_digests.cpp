#include "tensors/device_digests.h"

#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "device/digest_pipeline.h"
#include "digest/device_digest.h"

#ifdef DETAUDIT_DEVICE_DIGEST
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "device/cuda_queue.h"
#endif

namespace detaudit::hooks {

namespace {

constexpr int kMaxDevices = 64;
constexpr int kHostQueue = kMaxDevices;  // the registry's entry for the host queue (tests)
// Batches in flight per device: about two ops' inputs and outputs each, so a few hundred ops
// may run ahead of the digests before the op's thread waits.
constexpr int kSlots = 256;

// The pipeline's device part on the CPU, for tests of the recorder's path without a GPU
// (DETAUDIT_DEVICE_QUEUE=host): each batch is digested when it is enqueued, as the kernel reads
// it on the op's stream, and completes late, so that records are really held. A small ring, so
// that it fills.
class HostQueue : public device::DeviceQueue {
 public:
  int slots() const override { return int(results_.size()); }
  bool enqueue(const device::DigestJob* jobs, int n, void*, int slot) override {
    for (int j = 0; j < n; ++j) {
      DeviceDigester d(jobs[j].dtype);
      d.update(jobs[j].data, jobs[j].bytes);
      results_[size_t(slot)][size_t(j)] = d.finish();
    }
    return true;
  }
  bool wait(int) override {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    return true;
  }
  const lanes::LaneResult* results(int slot) override { return results_[size_t(slot)].data(); }

 private:
  std::array<std::array<lanes::LaneResult, device::kMaxBatch>, 4> results_{};
};

bool host_queue_requested() {
  static const bool on = [] {
    const char* v = std::getenv("DETAUDIT_DEVICE_QUEUE");
    return v && std::string(v) == "host";
  }();
  return on;
}

struct DevicePipeline {
  std::unique_ptr<device::DeviceQueue> queue;
  std::unique_ptr<device::DigestPipeline> pipeline;
};

// Made once per device and never destroyed: their collector threads run until the process
// ends, and CUDA may be gone before static destructors run.
std::mutex g_make_mu;
std::atomic<DevicePipeline*> g_pipelines[kMaxDevices + 1];
std::atomic<int8_t> g_state[kMaxDevices + 1];  // 0 not tried, 1 ready, -1 unavailable
std::atomic<pid_t> g_owner{0};                 // a forked child has no collector threads
std::atomic<uint64_t> g_failed{0};

std::unique_ptr<device::DeviceQueue> make_queue(int index) {
  if (index == kHostQueue) return std::make_unique<HostQueue>();
#ifdef DETAUDIT_DEVICE_DIGEST
  c10::cuda::CUDAGuard on_device(static_cast<c10::DeviceIndex>(index));
  std::string error;
  std::unique_ptr<device::CudaQueue> q = device::CudaQueue::create(kSlots, &error);
  if (!q)
    std::fprintf(stderr, "detaudit: %s; CUDA tensors of device %d are copied to the host\n",
                 error.c_str(), index);
  return q;
#else
  return nullptr;
#endif
}

DevicePipeline* pipeline_of(int index) {
  if (index < 0 || index > kMaxDevices) return nullptr;
  const int8_t state = g_state[index].load(std::memory_order_acquire);
  if (state < 0) return nullptr;
  if (state == 0) {
    std::lock_guard<std::mutex> lock(g_make_mu);
    if (g_state[index].load() == 0) {
      const pid_t pid = ::getpid();
      std::unique_ptr<device::DeviceQueue> queue = g_owner.load() == 0 || g_owner.load() == pid
                                                       ? make_queue(index)
                                                       : nullptr;
      if (!queue) {
        g_state[index].store(-1, std::memory_order_release);
        return nullptr;
      }
      auto made = std::make_unique<DevicePipeline>();
      made->queue = std::move(queue);
      made->pipeline = std::make_unique<device::DigestPipeline>(made->queue.get());
      g_owner.store(pid);
      g_pipelines[index].store(made.release());
      g_state[index].store(1, std::memory_order_release);
    }
    if (g_state[index].load() < 0) return nullptr;
  }
  // A forked child inherits the registry, not the collector threads.
  return g_owner.load(std::memory_order_relaxed) == ::getpid() ? g_pipelines[index].load()
                                                               : nullptr;
}

template <typename Fn>
void for_each_pipeline(Fn fn) {
  if (g_owner.load() != ::getpid()) return;
  for (int i = 0; i <= kMaxDevices; ++i)
    if (g_state[i].load(std::memory_order_acquire) == 1) fn(*g_pipelines[i].load()->pipeline);
}

}  // namespace

bool digests_on_device(const at::Tensor& t) {
  if (t.is_cuda()) {
#ifdef DETAUDIT_DEVICE_DIGEST
    return pipeline_of(t.device().index()) != nullptr;
#else
    return false;
#endif
  }
  return t.is_cpu() && host_queue_requested() && pipeline_of(kHostQueue) != nullptr;
}

void drain_device_digests() {
  for_each_pipeline([](device::DigestPipeline& p) { p.drain(); });
}

void drain_device_digests_for(int ms) {
  for_each_pipeline([ms](device::DigestPipeline& p) { p.drain_for(ms); });
}

std::string device_digest_status() {
  uint64_t batches = 0, full = 0;
  for_each_pipeline([&](device::DigestPipeline& p) {
    batches += p.batches();
    full += p.ring_full_waits();
  });
  if (batches == 0) return "";
  return "device digests: " + std::to_string(batches) + " batches, " + std::to_string(full) +
         " waits for a full ring, " + std::to_string(g_failed.load()) + " tensors failed";
}

std::shared_ptr<PendingDigest> DeviceBatch::add(const at::Tensor& tensor, bool with_stats) {
  at::Tensor t = tensor;
  {
    // Our copies, not the program's ops: no callback should see them, and no autograd node
    // (it would take a sequence number from the program's). On the tensor's device's current
    // stream, behind the op, like the digest that reads them.
    at::RecordFunctionGuard no_recording(false);
    c10::AutoGradMode no_autograd(false);
    if (t.is_conj()) t = t.resolve_conj();
    if (t.is_neg()) t = t.resolve_neg();
    if (!t.is_contiguous()) t = t.contiguous();
  }
  int device = kHostQueue;
  void* stream = nullptr;
#ifdef DETAUDIT_DEVICE_DIGEST
  if (t.is_cuda()) {
    device = t.device().index();
    stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  }
#endif
  if (!jobs_.empty() &&
      (device != device_ || stream != stream_ || jobs_.size() == size_t(device::kMaxBatch)))
    submit();
  device_ = device;
  stream_ = stream;
  jobs_.push_back({t.data_ptr(), uint64_t(t.nbytes()), uint8_t(t.scalar_type())});
  held_.push_back(std::move(t));
  digests_.push_back(std::make_shared<PendingDigest>(uint8_t(tensor.scalar_type()), with_stats));
  return digests_.back();
}

void DeviceBatch::submit() {
  if (jobs_.empty()) return;
  DevicePipeline* p = pipeline_of(device_);
  if (!p) {  // unavailable since (a fork): nothing was enqueued
    for (auto& d : digests_) d->complete(nullptr);
  } else {
#ifdef DETAUDIT_DEVICE_DIGEST
    std::optional<c10::cuda::CUDAGuard> on_device;
    if (device_ != kHostQueue) on_device.emplace(static_cast<c10::DeviceIndex>(device_));
#endif
    p->pipeline->submit(jobs_, stream_, [digests = digests_](const lanes::LaneResult* r, int n) {
      for (int i = 0; i < n; ++i) digests[size_t(i)]->complete(r ? &r[i] : nullptr);
      if (!r) g_failed.fetch_add(uint64_t(n), std::memory_order_relaxed);
    });
  }
  // Enqueued: the stream's order now keeps the memory until the digest has read it.
  jobs_.clear();
  held_.clear();
  digests_.clear();
}

}  // namespace detaudit::hooks
