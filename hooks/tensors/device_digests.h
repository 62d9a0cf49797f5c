// CUDA tensors digested on their own device (device/): the process's pipelines, one per device,
// and a thread's batch of tensors waiting to be enqueued on the op's stream. Built without the
// kernels (a CPU torch, or no nvcc), no device is available and CUDA tensors take the host copy.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device/lane_kernel.h"
#include "stream/pending_records.h"
#include "tensors/remembered_fills.h"

namespace detaudit::hooks {

// Whether t's device digest goes through a pipeline (makes it at first use): a CUDA tensor
// where the kernels are built; with DETAUDIT_DEVICE_QUEUE=host, for tests without a GPU, a CPU
// tensor through a queue on the host that completes late.
bool digests_on_device(const at::Tensor& t);
// Waits for every digest enqueued so far (at exit, at a thread's end, for a capture).
void drain_device_digests();
// The same from a stop signal's save: at most `ms` milliseconds, never blocking on a lock.
void drain_device_digests_for(int ms);
// A line for the .status file ("" when no device digest ran): launches, tensors, ring-full
// waits, failures, the peak bytes held by open batches, and why batches were launched.
std::string device_digest_status();

// Why an open batch was launched: the .status counts each ("device digests: ...").
enum class Launch : uint8_t {
  kFull,        // as many tensors as one launch takes
  kBytes,       // the bytes it holds reached record.device_batch_mib
  kOp,          // record.device_batch_mib is 0: a batch per op's inputs and per op's outputs
  kInPlace,     // an op is about to write a storage it holds (in place, out=, through a view)
  kEnclosing,   // a nested op ended inside an op whose own kernel may write what it returned
  kFreed,       // the program freed memory it holds (a storage resized), outside any op
  kCollective,  // a collective may read or write on another stream, or another process
  kStream,      // the thread moved to another device or stream
  kCompiled,    // a compiled region's kernels, which no callback sees
  kStep,        // a step boundary
  kCapture,     // an op captured for replay
  kThreadEnd,
  kExit,
  kSignal,
  kCount
};
const char* launch_name(Launch why);

// A fill's element as fill_'s kernels store `value` in `type`, into out (16 bytes): its size, 0
// for a dtype not listed. Throws where the value is out of the dtype's range.
size_t fill_element(const c10::Scalar& value, at::ScalarType type, uint8_t* out);

// One thread's open batch: the tensor versions its ops produced and read, digested in one launch
// for many ops. It holds what it reads, so that the caching allocator cannot give that memory to
// a later op; before anything could change those bytes it is launched (Launch), on the stream of
// the ops it holds. Another thread may launch it (an op there writes what it holds, a step
// boundary), so it has a lock; the op's own thread takes it uncontended.
class DeviceBatch {
 public:
  DeviceBatch();   // one of the process's open batches
  ~DeviceBatch();  // launched (kThreadEnd), and no longer open
  DeviceBatch(const DeviceBatch&) = delete;
  DeviceBatch& operator=(const DeviceBatch&) = delete;

  // t's digest, computed on its device on the current stream when the batch is launched. A
  // non-contiguous t is read in place through its strides where the queue can (a view of up to
  // kMaxJobDims merged dimensions), else made contiguous on that stream now.
  std::shared_ptr<PendingDigest> add(const at::Tensor& t, bool with_stats);
  // What `self.fill_(value)` writes (zero_: value 0), digested now from the value alone: no
  // batch holds or reads it. self is a dense tensor of this thread's device digest. Null where
  // that is not worth it (more than a leaf's bytes: the kernel reads it faster) or not known (a
  // dtype the fill converts to apart, a value out of its range); the output is then digested as
  // found.
  std::shared_ptr<PendingDigest> digest_of_fill(const at::Tensor& self, const c10::Scalar& value,
                                                bool with_stats);
  // Enqueues the batch behind what its stream holds. Never waits for the device.
  void launch(Launch why);
  // Holds nothing (read without the lock: the owner's test before a launch).
  bool empty() const { return held_count_.load(std::memory_order_relaxed) == 0; }
  // Tensors added since the thread began, launched or not (the owner's thread reads it).
  uint64_t adds() const { return adds_; }
  // Whether every tensor still held of those added since adds() was `since` reads memory no
  // one else writes (a copy made here) or one of `storages` (StorageImpl pointers).
  bool added_since_reads_only(uint64_t since, const std::vector<const void*>& storages);
  // A forked child's: the parent's tensors, whose digests the child never computes.
  void forget_after_fork();

 private:
  // From a signal's save (max_wait_ms >= 0): false, with the batch as it was, when the pipeline
  // stayed busy that long.
  // What it held goes to *released, to be let go once the lock is: freeing a CUDA tensor's memory
  // takes the caching allocator's lock, under which its trace callback takes ours.
  bool launch_locked(Launch why, std::vector<c10::Storage>* released, long max_wait_ms = -1);
  bool holds_locked(const void* storage) const;
  // Completes every digest as not read, with no device call (a signal's save, a capture).
  void abandon_locked(std::vector<c10::Storage>* released);
  // Empties the batch; what it held goes to *released.
  void clear_locked(std::vector<c10::Storage>* released);
  friend void launch_batches_holding(const at::Tensor& written);
  friend void launch_open_batches(Launch why, long max_wait_ms);
  friend void launch_batches_holding_memory(uintptr_t begin, uintptr_t end);

  RememberedFills<lanes::LaneResult> fills_;  // digest_of_fill

  std::mutex mu_;
  int device_ = -1;
  void* stream_ = nullptr;
  uint64_t bytes_ = 0;
  std::vector<device::DigestJob> jobs_;
  int strided_jobs_ = 0;  // of jobs_: at most device::kMaxStridedJobs a launch
  // Storages, not tensors: a tensor's reference count is the program's to read (AccumulateGrad
  // steals a gradient no one else refers to, and copies one that someone does).
  std::vector<c10::Storage> held_;
  std::atomic<uint32_t> held_count_{0};
  uint64_t adds_ = 0;
  std::vector<std::shared_ptr<PendingDigest>> digests_;
  // The program's storage each job reads, null for a copy made here (no one else's), and a
  // 64-bit filter of them: most writes are to storages no batch holds, and are told so in one
  // test.
  std::vector<const void*> storages_;
  uint64_t storage_filter_ = 0;
};

// A copy's output described by its source's digest (the same bytes): counted for `.status`.
void note_copy_described_by_source();

// Whether any batch holds anything: the checks below cost nothing while none does.
bool any_device_batch_open();
// Before an op writes `written`: launches every open batch that holds its storage, and, where
// such a batch is on another stream than the writer's, makes the writer's stream wait for it.
void launch_batches_holding(const at::Tensor& written);
// Launches every open batch. max_wait_ms >= 0 (a signal's save): a batch whose lock is held that
// long is left as it is, and a CUDA device's batch is given up, its tensors not read (no CUDA call
// while the interrupted thread may hold the driver's locks).
void launch_open_batches(Launch why, long max_wait_ms = -1);
// record.device_batch_mib, in bytes: 0 launches a batch per op's inputs and per op's outputs.
void set_device_batch_cap(uint64_t bytes);
uint64_t device_batch_cap();
// A forked child's registry of open batches starts empty (the parent's threads are not here).
void forget_open_batches_after_fork();

}  // namespace detaudit::hooks
