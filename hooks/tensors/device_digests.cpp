#include "tensors/device_digests.h"

#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "device/cuda_queue.h"
#include "device/digest_pipeline.h"
#include "device/host_queue.h"
#include "device/strided_job.h"
#include "digest/device_digest.h"
#include "tensors/cuda_graphs.h"
#include "tensors/tensor_digest.h"

#ifdef DETAUDIT_DEVICE_DIGEST
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/version.h>
#endif

namespace detaudit::hooks {

// Launches the open batches that read [begin, end): the program is freeing it (DeviceBatch).
void launch_batches_holding_memory(uintptr_t begin, uintptr_t end);

namespace {

constexpr int kMaxDevices = 64;
constexpr int kHostQueue = kMaxDevices;  // the registry's entry for the host queue (tests)
// Launches in flight per device, each of many ops' tensors: thousands of ops may run ahead of
// the digests before the op's thread waits.
constexpr int kSlots = 64;

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
std::atomic<int8_t> g_state[kMaxDevices + 1];        // 0 not tried, 1 ready, -1 unavailable
std::atomic<bool> g_reads_strided[kMaxDevices + 1];  // its queue's, set before g_state is 1
std::atomic<pid_t> g_owner{0};                       // a forked child has no collector threads
std::atomic<uint64_t> g_failed{0};

// The open batches (DeviceBatch), what they hold, and why they were launched.
std::mutex g_open_mu;
std::vector<DeviceBatch*> g_open;
std::atomic<uint64_t> g_held_tensors{0}, g_held_bytes{0}, g_peak_held_bytes{0};
std::atomic<uint64_t> g_tensors_launched{0};
std::atomic<uint64_t> g_abandoned{0};  // given up at a signal (DeviceBatch::abandon_locked)
std::atomic<uint64_t> g_abandoned_in_capture{0};  // their stream began capturing a CUDA graph
// Tensors not contiguous in the digest's order (a transpose, channels_last): copied by add(), or
// read in place through their strides where the queue can.
std::atomic<uint64_t> g_copies{0}, g_copied_bytes{0}, g_strided_reads{0};
// Outputs described from their op's arguments, never read (digest_of_fill, a copy's source).
std::atomic<uint64_t> g_fills_known{0}, g_copies_by_source{0};
std::atomic<uint64_t> g_launches[size_t(Launch::kCount)];
std::atomic<uint64_t> g_cap_bytes{uint64_t(256) << 20};

// What a launch let go of inside the caching allocator's free (its trace callback): the last
// reference to another block dropped there would free that block re-entrantly, merging it with
// the block being freed while that free still uses it. Let go at the next add instead.
std::mutex g_deferred_mu;
std::vector<c10::Storage> g_deferred;
std::atomic<bool> g_any_deferred{false};

void release_deferred() {
  if (!g_any_deferred.load(std::memory_order_relaxed)) return;
  std::vector<c10::Storage> now;  // let go after the lock (declared before it)
  std::lock_guard<std::mutex> lock(g_deferred_mu);
  now.swap(g_deferred);
  g_any_deferred.store(false, std::memory_order_relaxed);
}

// A forked child's counters start at zero while its thread's batch still holds the parent's
// tensors: never below zero.
void take_away(std::atomic<uint64_t>* counter, uint64_t n) {
  uint64_t now = counter->load(std::memory_order_relaxed);
  while (!counter->compare_exchange_weak(now, now > n ? now - n : 0, std::memory_order_relaxed)) {
  }
}

uint64_t filter_bit(const void* storage) {
  return uint64_t(1) << ((reinterpret_cast<uintptr_t>(storage) >> 4) & 63);
}

#ifdef DETAUDIT_DEVICE_DIGEST
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
// Memory an open batch holds is freed only by the program resizing its storage (FSDP's
// `untyped_storage().resize_(0)`), outside any op: the caching allocator tells, and the batches
// holding it are launched before the memory can be handed out again. Called under the
// allocator's lock: the batches never call the allocator under theirs.
void watch_frees_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker([](const auto& entry) {
      using Entry = std::decay_t<decltype(entry)>;
      if (entry.action_ != Entry::FREE_REQUESTED || !any_device_batch_open()) return;
      launch_batches_holding_memory(entry.addr_, entry.addr_ + entry.size_);
    });
  });
}
#else
void watch_frees_once() {}  // torch 2.0 has no trace tracker: a resized storage is not seen
#endif
#endif

std::unique_ptr<device::DeviceQueue> make_queue(int index) {
  if (index == kHostQueue) return std::make_unique<device::HostQueue>();
#ifdef DETAUDIT_DEVICE_DIGEST
  watch_frees_once();
  c10::cuda::CUDAGuard on_device(static_cast<c10::DeviceIndex>(index));
  std::string error;
  std::unique_ptr<device::CudaQueue> q = device::CudaQueue::create(
      kSlots, device::CudaQueue::kernel_from_env(), &error);
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
      g_reads_strided[index].store(made->queue->reads_strided(), std::memory_order_relaxed);
      g_pipelines[index].store(made.release());
      g_state[index].store(1, std::memory_order_release);
    }
    if (g_state[index].load() < 0) return nullptr;
  }
  // A forked child inherits the registry, not the collector threads.
  return g_owner.load(std::memory_order_relaxed) == ::getpid() ? g_pipelines[index].load()
                                                               : nullptr;
}

// Whether the device's queue reads strided views in place: a relaxed load once its pipeline is
// made (pipeline_of asks the OS for the pid: not per tensor).
bool reads_strided(int device) {
  if (g_state[device].load(std::memory_order_acquire) == 0) pipeline_of(device);
  return g_state[device].load(std::memory_order_acquire) == 1 &&
         g_reads_strided[device].load(std::memory_order_relaxed);
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
  uint64_t batches = 0, full = 0, calls = 0;
  for_each_pipeline([&](device::DigestPipeline& p) {
    batches += p.batches();
    full += p.ring_full_waits();
  });
  if (batches == 0) return "";
  for (int i = 0; i <= kMaxDevices; ++i)
    if (g_state[i].load(std::memory_order_acquire) == 1 && g_owner.load() == ::getpid())
      calls += g_pipelines[i].load()->queue->device_calls();
  std::string why;
  for (size_t i = 0; i < size_t(Launch::kCount); ++i)
    if (const uint64_t n = g_launches[i].load())
      why += std::string(why.empty() ? "" : ", ") + launch_name(Launch(i)) + " " +
             std::to_string(n);
  return "device digests: " + std::to_string(batches) + " launches, " +
         std::to_string(g_tensors_launched.load()) + " tensors, " + std::to_string(full) +
         " waits for a full ring, " + std::to_string(g_failed.load()) +
         " tensors failed, peak held " + std::to_string(g_peak_held_bytes.load()) +
         " bytes; launched for: " + why +
         (calls ? "; " + std::to_string(calls) + " CUDA calls to launch them" +
                      (host_queue_requested() ? " (what CudaQueue would make)" : "")
                : "") +
         (g_copies.load() ? "; " + std::to_string(g_copies.load()) + " tensors (" +
                                std::to_string(g_copied_bytes.load()) +
                                " bytes) copied to the digest's order first"
                          : "") +
         (g_strided_reads.load() ? "; " + std::to_string(g_strided_reads.load()) +
                                       " tensors read in place through their strides"
                                 : "") +
         (g_fills_known.load() + g_copies_by_source.load()
              ? "; outputs known from their arguments, not read: " +
                    std::to_string(g_fills_known.load()) + " fills, " +
                    std::to_string(g_copies_by_source.load()) + " copies"
              : "") +
         (g_abandoned.load() ? "; " + std::to_string(g_abandoned.load()) +
                                   " tensors of open batches not read at a signal"
                             : "") +
         (g_abandoned_in_capture.load()
              ? "; " + std::to_string(g_abandoned_in_capture.load()) +
                    " tensors not read: their stream began capturing a CUDA graph"
              : "");
}

const char* launch_name(Launch why) {
  switch (why) {
    case Launch::kFull: return "full";
    case Launch::kBytes: return "bytes";
    case Launch::kOp: return "op";
    case Launch::kInPlace: return "in place";
    case Launch::kEnclosing: return "enclosing kernel";
    case Launch::kFreed: return "freed";
    case Launch::kCollective: return "collective";
    case Launch::kStream: return "stream";
    case Launch::kCompiled: return "compiled";
    case Launch::kStep: return "step";
    case Launch::kCapture: return "capture";
    case Launch::kThreadEnd: return "thread end";
    case Launch::kExit: return "exit";
    case Launch::kSignal: return "signal";
    case Launch::kCount: break;
  }
  return "?";
}

void set_device_batch_cap(uint64_t bytes) { g_cap_bytes.store(bytes); }
uint64_t device_batch_cap() { return g_cap_bytes.load(std::memory_order_relaxed); }

namespace {

// A fill's element as the kernels store it: `value.to<T>()` (fill_'s CPU and CUDA kernels).
template <typename T>
size_t element_of(const c10::Scalar& value, uint8_t* out) {
  const T v = value.to<T>();
  std::memcpy(out, &v, sizeof v);
  return sizeof v;
}

}  // namespace

size_t fill_element(const c10::Scalar& value, at::ScalarType type, uint8_t* out) {
  switch (type) {
    case at::kByte: return element_of<uint8_t>(value, out);
    case at::kChar: return element_of<int8_t>(value, out);
    case at::kShort: return element_of<int16_t>(value, out);
    case at::kInt: return element_of<int32_t>(value, out);
    case at::kLong: return element_of<int64_t>(value, out);
    case at::kHalf: return element_of<at::Half>(value, out);
    case at::kFloat: return element_of<float>(value, out);
    case at::kDouble: return element_of<double>(value, out);
    case at::kComplexFloat: return element_of<c10::complex<float>>(value, out);
    case at::kComplexDouble: return element_of<c10::complex<double>>(value, out);
    case at::kBool: return element_of<bool>(value, out);
    case at::kBFloat16: return element_of<at::BFloat16>(value, out);
    default: return 0;
  }
}

std::shared_ptr<PendingDigest> DeviceBatch::digest_of_fill(const at::Tensor& self,
                                                           const c10::Scalar& value,
                                                           bool with_stats) {
  // A leaf: on the op's thread a fill of more costs more than the kernel's read of it.
  constexpr uint64_t kMaxBytes = uint64_t(lanes::kLeafWords) * 8;
  if (uint64_t(self.nbytes()) > kMaxBytes) return nullptr;
  uint8_t element[16];
  size_t size = 0;
  try {
    size = fill_element(value, self.scalar_type(), element);
  } catch (const std::exception&) {
    return nullptr;  // out of the dtype's range: the fill itself fails
  }
  if (size != size_t(self.element_size())) return nullptr;
  const trace::Dtype dtype = dtype_of(self);
  const uint64_t count = uint64_t(self.numel());
  // Programs fill alike again and again (sum's zeros, each step): remembered, the reference's
  // 650 MB/s with statistics runs once for each.
  const lanes::LaneResult* result = fills_.find(dtype, element, size, count);
  if (!result)
    result = &fills_.remember(dtype, element, size, count,
                              device_digest_of_fill(dtype, element, size, count));
  auto digest = std::make_shared<PendingDigest>(dtype, with_stats);
  digest->complete(result);
  g_fills_known.fetch_add(1, std::memory_order_relaxed);
  return digest;
}

void note_copy_described_by_source() { g_copies_by_source.fetch_add(1, std::memory_order_relaxed); }

bool any_device_batch_open() { return g_held_tensors.load(std::memory_order_relaxed) > 0; }

void forget_open_batches_after_fork() {
  new (&g_open_mu) std::mutex();  // another thread may have held it at fork time
  g_open.clear();
  new (&g_deferred_mu) std::mutex();
  g_deferred.clear();
  g_any_deferred.store(false);
  g_held_tensors.store(0);
  g_held_bytes.store(0);
}

DeviceBatch::DeviceBatch() {
  std::lock_guard<std::mutex> lock(g_open_mu);
  g_open.push_back(this);
}

DeviceBatch::~DeviceBatch() {
  {
    std::lock_guard<std::mutex> lock(g_open_mu);
    g_open.erase(std::remove(g_open.begin(), g_open.end(), this), g_open.end());
  }
  launch(Launch::kThreadEnd);
}

void DeviceBatch::forget_after_fork() {
  new (&mu_) std::mutex();
  for (auto& d : digests_) d->complete(nullptr);
  std::vector<c10::Storage> released;
  clear_locked(&released);  // the child's counters started at zero: not taken from them
  std::lock_guard<std::mutex> lock(g_open_mu);
  if (std::find(g_open.begin(), g_open.end(), this) == g_open.end()) g_open.push_back(this);
}

bool DeviceBatch::holds_locked(const void* storage) const {
  if (!(storage_filter_ & filter_bit(storage))) return false;
  return std::find(storages_.begin(), storages_.end(), storage) != storages_.end();
}

std::shared_ptr<PendingDigest> DeviceBatch::add(const at::Tensor& tensor, bool with_stats) {
  release_deferred();
  at::Tensor t = tensor;
  int device = kHostQueue;
  void* stream = nullptr;
#ifdef DETAUDIT_DEVICE_DIGEST
  if (t.is_cuda()) {
    device = t.device().index();
    stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  }
#endif
  device::DigestJob job{nullptr, 0, dtype_of(tensor)};
  // Not in the digest's order (a transpose, channels_last, a conjugate view): read in place
  // through its strides where the queue can, else copied.
  if (t.is_conj() || t.is_neg() || !t.is_contiguous()) {
    if (!t.is_conj() && !t.is_neg() && t.numel() > 0 && reads_strided(device) &&
        device::strided_geometry(t.data_ptr(), t.element_size(), t.sizes().data(),
                                 t.strides().data(), size_t(t.dim()), &job.geometry)) {
      job.strided = true;
      g_strided_reads.fetch_add(1, std::memory_order_relaxed);
    } else {
      // The guards cost more than the add itself: set only when a copy is made.
      // Our copies, not the program's ops: no callback should see them, and no autograd node
      // (it would take a sequence number from the program's). On the tensor's device's current
      // stream, behind the op, like the digest that reads them.
      at::RecordFunctionGuard no_recording(false);
      c10::AutoGradMode no_autograd(false);
      if (t.is_conj()) t = t.resolve_conj();
      if (t.is_neg()) t = t.resolve_neg();
      if (!t.is_contiguous()) t = t.contiguous();
      g_copies.fetch_add(1, std::memory_order_relaxed);
      g_copied_bytes.fetch_add(uint64_t(t.nbytes()), std::memory_order_relaxed);
    }
  }
  const uint64_t bytes = uint64_t(t.nbytes());  // a strided view's: its elements', gathered
  job.data = t.data_ptr();
  job.bytes = bytes;
  std::vector<c10::Storage> released;  // let go after the lock (declared before it)
  std::lock_guard<std::mutex> lock(mu_);
  if (!jobs_.empty() && (device != device_ || stream != stream_))
    launch_locked(Launch::kStream, &released);
  if (job.strided && strided_jobs_ == device::kMaxStridedJobs)
    launch_locked(Launch::kFull, &released);
  device_ = device;
  stream_ = stream;
  jobs_.push_back(job);
  strided_jobs_ += job.strided ? 1 : 0;
  // The program's own storage: a later write to it must launch this batch first.
  const void* storage = t.storage().unsafeGetStorageImpl();
  if (storage == tensor.storage().unsafeGetStorageImpl()) {
    storages_.push_back(storage);
    storage_filter_ |= filter_bit(storage);
  } else {
    storages_.push_back(nullptr);
  }
  held_.push_back(t.storage());
  held_count_.store(uint32_t(held_.size()), std::memory_order_relaxed);
  ++adds_;
  digests_.push_back(std::make_shared<PendingDigest>(dtype_of(tensor), with_stats));
  std::shared_ptr<PendingDigest> digest = digests_.back();
  bytes_ += bytes;
  g_held_tensors.fetch_add(1, std::memory_order_relaxed);
  const uint64_t held = g_held_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  uint64_t peak = g_peak_held_bytes.load(std::memory_order_relaxed);
  while (held > peak && !g_peak_held_bytes.compare_exchange_weak(peak, held)) {
  }
  if (jobs_.size() == size_t(device::kMaxBatch))
    launch_locked(Launch::kFull, &released);
  else if (device_batch_cap() > 0 && bytes_ >= device_batch_cap())
    launch_locked(Launch::kBytes, &released);
  return digest;
}

bool DeviceBatch::added_since_reads_only(uint64_t since, const std::vector<const void*>& storages) {
  std::lock_guard<std::mutex> lock(mu_);
  // The first of them may have been launched since: no longer held.
  const size_t n = size_t(std::min<uint64_t>(adds_ - since, storages_.size()));
  for (size_t i = storages_.size() - n; i < storages_.size(); ++i)
    if (storages_[i] && std::find(storages.begin(), storages.end(), storages_[i]) == storages.end())
      return false;
  return true;
}

void DeviceBatch::launch(Launch why) {
  if (empty()) return;
  std::vector<c10::Storage> released;
  std::lock_guard<std::mutex> lock(mu_);
  launch_locked(why, &released);
}

bool DeviceBatch::launch_locked(Launch why, std::vector<c10::Storage>* released, long max_wait_ms) {
  if (jobs_.empty()) return true;
  // The program began capturing a CUDA graph on the batch's own stream: a launch now would
  // become part of its graph. Given up, its tensors not read (cuda_graphs.h).
  if (device_ != kHostQueue && stream_capturing(stream_)) {
    g_abandoned_in_capture.fetch_add(jobs_.size(), std::memory_order_relaxed);
    abandon_locked(released);
    return true;
  }
  DevicePipeline* p = pipeline_of(device_);
  if (!p) {  // unavailable since (a fork): nothing was enqueued
    for (auto& d : digests_) d->complete(nullptr);
  } else {
#ifdef DETAUDIT_DEVICE_DIGEST
    std::optional<c10::cuda::CUDAGuard> on_device;
    if (device_ != kHostQueue) on_device.emplace(static_cast<c10::DeviceIndex>(device_));
#endif
    auto done = [digests = digests_](const lanes::LaneResult* r, int n) {
      for (int i = 0; i < n; ++i) digests[size_t(i)]->complete(r ? &r[i] : nullptr);
      if (!r) g_failed.fetch_add(uint64_t(n), std::memory_order_relaxed);
    };
    if (max_wait_ms < 0)
      p->pipeline->submit(jobs_, stream_, std::move(done));
    else if (!p->pipeline->submit_within(jobs_, stream_, std::move(done), int(max_wait_ms)))
      return false;
  }
  g_launches[size_t(why)].fetch_add(1, std::memory_order_relaxed);
  g_tensors_launched.fetch_add(jobs_.size(), std::memory_order_relaxed);
  // Enqueued: the stream's order now keeps the memory until the digest has read it.
  take_away(&g_held_tensors, jobs_.size());
  take_away(&g_held_bytes, bytes_);
  clear_locked(released);
  return true;
}

void DeviceBatch::abandon_locked(std::vector<c10::Storage>* released) {
  if (jobs_.empty()) return;
  for (auto& d : digests_) d->complete(nullptr);
  g_failed.fetch_add(jobs_.size(), std::memory_order_relaxed);
  take_away(&g_held_tensors, jobs_.size());
  take_away(&g_held_bytes, bytes_);
  clear_locked(released);
}

void DeviceBatch::clear_locked(std::vector<c10::Storage>* released) {
  jobs_.clear();
  strided_jobs_ = 0;
  std::move(held_.begin(), held_.end(), std::back_inserter(*released));
  held_.clear();  // keeps its capacity: a warm thread's batches allocate nothing to hold
  held_count_.store(0, std::memory_order_relaxed);
  digests_.clear();
  storages_.clear();
  storage_filter_ = 0;
  bytes_ = 0;
}

void launch_batches_holding(const at::Tensor& written) {
  if (!any_device_batch_open() || !written.defined() || !written.has_storage()) return;
  const void* storage = written.storage().unsafeGetStorageImpl();
  void* writer_stream = nullptr;
#ifdef DETAUDIT_DEVICE_DIGEST
  if (written.is_cuda())
    writer_stream = c10::cuda::getCurrentCUDAStream(written.device().index()).stream();
#endif
  std::vector<c10::Storage> released;
  std::lock_guard<std::mutex> open(g_open_mu);
  for (DeviceBatch* b : g_open) {
    std::lock_guard<std::mutex> lock(b->mu_);
    if (!b->holds_locked(storage)) continue;
    const int device = b->device_;
    void* stream = b->stream_;
    b->launch_locked(Launch::kInPlace, &released);
    // The digest is enqueued on the batch's stream: a write on another stream waits for it.
    // Not a writer being captured into a graph: its write runs at a replay, after the launch,
    // and a wait on an event from outside would break the program's capture.
    if (stream != writer_stream && device != kHostQueue && !stream_capturing(writer_stream))
      if (DevicePipeline* p = pipeline_of(device)) p->queue->make_wait(writer_stream, stream);
  }
}

void launch_batches_holding_memory(uintptr_t begin, uintptr_t end) {
  std::vector<c10::Storage> released;
  {
    std::lock_guard<std::mutex> open(g_open_mu);
    for (DeviceBatch* b : g_open) {
      std::lock_guard<std::mutex> lock(b->mu_);
      for (const device::DigestJob& job : b->jobs_) {
        const auto data = reinterpret_cast<uintptr_t>(job.data);
        if (data < end && begin < data + job.bytes) {
          b->launch_locked(Launch::kFreed, &released);
          break;
        }
      }
    }
  }
  if (released.empty()) return;
  std::lock_guard<std::mutex> lock(g_deferred_mu);  // nothing is let go under it
  std::move(released.begin(), released.end(), std::back_inserter(g_deferred));
  g_any_deferred.store(true, std::memory_order_relaxed);
}

void launch_open_batches(Launch why, long max_wait_ms) {
  if (max_wait_ms < 0) release_deferred();
  if (!any_device_batch_open()) return;
  std::vector<c10::Storage> released;
  if (max_wait_ms < 0) {
    std::lock_guard<std::mutex> open(g_open_mu);
    for (DeviceBatch* b : g_open) {
      std::lock_guard<std::mutex> lock(b->mu_);
      b->launch_locked(why, &released);
    }
    return;
  }
  // From a signal's save: the interrupted thread may hold a lock; wait a while, then leave it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(max_wait_ms);
  auto try_until_deadline = [&](std::mutex& mu) {
    while (!mu.try_lock()) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  };
  if (!try_until_deadline(g_open_mu)) return;
  std::lock_guard<std::mutex> held_open(g_open_mu, std::adopt_lock);
  for (DeviceBatch* b : g_open) {
    if (!try_until_deadline(b->mu_)) continue;
    std::lock_guard<std::mutex> lock(b->mu_, std::adopt_lock);
    // No CUDA call from a signal's save: the interrupted thread may hold the driver's locks. A
    // device batch's tensors are given up (their records are saved, the tensors not read); the
    // host queue's, all host code, are launched.
    if (b->device_ != kHostQueue) {
      g_abandoned.fetch_add(b->jobs_.size(), std::memory_order_relaxed);
      b->abandon_locked(&released);
      continue;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    b->launch_locked(why, &released, std::max<long>(0, long(left.count())));
  }
}

}  // namespace detaudit::hooks
