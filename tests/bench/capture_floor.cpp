// The least the op's thread spends in a recorder that reads each new tensor: for each tensor an
// op reads or returns, its identity, version and geometry (a head), appended to the thread's
// buffer, which a worker thread takes every 256 KiB; and for a new tensor version of at most
// 64 KiB, one of three things (DETAUDIT_BENCH_CAPTURE):
// - unset: its bytes copied after the head (the program may change them before another core
//   reads them), and XXH3-hashed by the worker;
// - "reference": the tensor held until the worker has hashed it where it lies (a real recorder
//   would then have to hash on the op's thread any such tensor an op is about to write; not done
//   here);
// - "inline": hashed on the op's thread, where it lies, as the interposer does (without its
//   statistics, cache and records); the worker gets the heads alone.
// - "inline-all": the same for a new tensor version of any size, one above 1 MiB in 1 MiB pieces
//   on torch's intra-op threads, as the interposer hashes its leaves: the floor of a recorder
//   that reads every new tensor once where it lies, for workloads of large tensors (gpt2, embed),
//   without the statistics, the logical order of a strided view, cache, descriptions or records.
//
// Not a recorder. A direct-mapped table of the tensor versions already seen stands for the cache
// the op's thread would keep (DETAUDIT_BENCH_CAPTURE_SEEN=off drops it: every small tensor
// copied each time an op names it). For the bench's workloads only: a forked child has no
// worker thread. Preloaded by bench.py as the modes "floor: capture only, ...";
// docs/performance.md compares them with the empty callback (callback_floor.cpp) and the
// interposer.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "attach/op_callback.h"

namespace {

constexpr size_t kCopyBytes = 64 * 1024;  // larger tensors: geometry only
constexpr size_t kHandoverBytes = 256 * 1024;
constexpr size_t kBufferBytes = kHandoverBytes + kCopyBytes + 4096;
constexpr size_t kHeldTensors = 64;

struct TensorHead {
  const void* impl;
  const void* storage;
  uint32_t version;
  uint8_t dtype, dims;
  int64_t offset;
  int64_t sizes[6], strides[6];
  uint32_t copied;    // bytes that follow the head
  uint32_t referred;  // or: bytes of the next held tensor's storage span, hashed where they lie
};

// A thread's heads and copies, and the tensors it holds for the worker to hash.
struct Batch {
  std::string bytes;
  std::vector<at::Tensor> held;
  void clear() {
    bytes.clear();
    held.clear();
  }
};

class Worker {
 public:
  static Worker& instance() {
    static Worker* w = new Worker();  // never destroyed: threads may hand over at exit
    return *w;
  }
  // Takes a full batch; gives back an empty one, waiting for the worker if it has none: a
  // fixed set of buffers, made once, so that no hand-over maps fresh memory.
  Batch swap(Batch&& full) {
    std::unique_lock<std::mutex> lock(mu_);
    queue_.push_back(std::move(full));
    cv_.notify_one();
    spare_cv_.wait(lock, [this] { return !spare_.empty(); });
    Batch empty = std::move(spare_.back());
    spare_.pop_back();
    empty.clear();
    return empty;
  }

 private:
  Worker() {
    for (int i = 0; i < 8; ++i) {
      spare_.emplace_back();
      spare_.back().bytes.reserve(kBufferBytes);
      spare_.back().held.reserve(kHeldTensors);
    }
    std::thread([this] { loop(); }).detach();
  }
  void loop() {
    for (;;) {
      Batch batch;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        batch = std::move(queue_.front());
        queue_.erase(queue_.begin());
      }
      const std::string& buf = batch.bytes;
      uint64_t h = 0;
      size_t next_held = 0;
      for (size_t at = 0; at + sizeof(TensorHead) <= buf.size();) {
        TensorHead head;
        std::memcpy(&head, buf.data() + at, sizeof head);
        at += sizeof head;
        h ^= XXH3_64bits(buf.data() + at, head.copied);
        at += head.copied;
        if (head.referred) h ^= XXH3_64bits(batch.held[next_held++].data_ptr(), head.referred);
      }
      sink_.fetch_xor(h, std::memory_order_relaxed);  // kept, so the hashing is not optimized away
      batch.held.clear();                             // the tensors go here, on the worker's thread
      std::lock_guard<std::mutex> lock(mu_);
      spare_.push_back(std::move(batch));
      spare_cv_.notify_one();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, spare_cv_;
  std::vector<Batch> queue_, spare_;
  std::atomic<uint64_t> sink_{0};
};

struct ThreadBuffer {
  Batch batch;
  // Tensor versions whose bytes were copied already, direct-mapped: a lower bound on what an
  // op-thread cache costs (it ignores address reuse and writes through aliases, which a real
  // one must not).
  struct Seen {
    const void* impl = nullptr;
    uint32_t version = 0;
  };
  std::vector<Seen> seen = std::vector<Seen>(4096);
  ThreadBuffer() {
    batch.bytes.reserve(kBufferBytes);
    batch.held.reserve(kHeldTensors);
  }
};
// initial-exec, as the interposer's: preloaded, never dlopen'ed late.
__attribute__((tls_model("initial-exec"))) thread_local ThreadBuffer tls;
const bool remember_seen = [] {
  const char* v = std::getenv("DETAUDIT_BENCH_CAPTURE_SEEN");
  return !(v && std::string(v) == "off");
}();
enum class Bytes { kCopied, kReferred, kHashedInline, kHashedInlineAll };
const Bytes bytes_policy = [] {
  const char* set = std::getenv("DETAUDIT_BENCH_CAPTURE");
  const std::string v = set ? set : "";
  return v == "reference"    ? Bytes::kReferred
         : v == "inline"     ? Bytes::kHashedInline
         : v == "inline-all" ? Bytes::kHashedInlineAll
                             : Bytes::kCopied;
}();
__attribute__((tls_model("initial-exec"))) thread_local uint64_t inline_sink = 0;
std::atomic<uint64_t> pieces_sink{0};

// A span above 1 MiB in 1 MiB pieces on torch's threads; kept, so it is not optimized away.
void hash_in_pieces(const char* p, size_t span) {
  constexpr size_t kPiece = size_t(1) << 20;
  const int64_t pieces = int64_t((span + kPiece - 1) / kPiece);
  at::parallel_for(0, pieces, 1, [&](int64_t from, int64_t to) {
    uint64_t h = 0;
    for (int64_t i = from; i < to; ++i) {
      const size_t at = size_t(i) * kPiece;
      h ^= XXH3_64bits(p + at, std::min(kPiece, span - at));
    }
    pieces_sink.fetch_xor(h, std::memory_order_relaxed);
  });
}

void append(const TensorHead& head) {
  tls.batch.bytes.append(reinterpret_cast<const char*>(&head), sizeof head);
}

void capture(const at::Tensor& t) {
  if (!t.defined()) return;
  TensorHead head{};
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  head.impl = impl;
  const auto& vc = impl->version_counter();
  head.version = vc.enabled() ? vc.current_version() : 0;
  head.dtype = uint8_t(t.scalar_type());
  head.dims = uint8_t(std::min<int64_t>(t.dim(), 6));
  if (remember_seen) {
    ThreadBuffer::Seen& s = tls.seen[(reinterpret_cast<uintptr_t>(impl) >> 4) & 4095];
    if (s.impl == impl && s.version == head.version) {
      append(head);
      return;
    }
    s.impl = impl;
    s.version = head.version;
  }
  if (!impl->has_storage() || !t.is_cpu()) {
    append(head);
    return;
  }
  head.storage = t.storage().unsafeGetStorageImpl();
  head.offset = t.storage_offset();
  auto sizes = t.sizes();
  auto strides = t.strides();
  // The storage span the view covers: copied whole, the gather left to the other core.
  int64_t last = 0;
  bool plain = true;
  for (size_t d = 0; d < head.dims; ++d) {
    head.sizes[d] = sizes[d];
    head.strides[d] = strides[d];
    if (strides[d] < 0) plain = false;
    if (sizes[d] == 0) plain = false;
    last += (sizes[d] - 1) * strides[d];
  }
  const size_t span = plain ? size_t(last + 1) * t.element_size() : 0;
  if (bytes_policy == Bytes::kHashedInlineAll && span > 0) {
    if (span > (size_t(1) << 20))
      hash_in_pieces(static_cast<const char*>(t.data_ptr()), span);
    else
      inline_sink ^= XXH3_64bits(t.data_ptr(), span);
    append(head);
    return;
  }
  if (span > kCopyBytes || t.dim() > 6) {
    append(head);
    return;
  }
  if (bytes_policy == Bytes::kReferred) {
    head.referred = uint32_t(span);
    append(head);
    tls.batch.held.push_back(t);
    return;
  }
  if (bytes_policy == Bytes::kHashedInline) {
    inline_sink ^= XXH3_64bits(t.data_ptr(), span);
    append(head);
    return;
  }
  head.copied = uint32_t(span);
  append(head);
  tls.batch.bytes.append(static_cast<const char*>(t.data_ptr()), span);
}

void capture_all(const c10::IValue& v) {
  if (v.isTensor()) {
    capture(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) capture(t);
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) capture_all(e);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) capture_all(e);
  }
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (fn.scope() == at::RecordScope::USER_SCOPE) return nullptr;
  for (const c10::IValue& v : fn.inputs()) capture_all(v);
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (fn.scope() == at::RecordScope::USER_SCOPE) return;
  for (const c10::IValue& v : fn.outputs()) capture_all(v);
  // Held tensors go soon: each keeps its memory from the program until the worker is done.
  if (tls.batch.bytes.size() >= kHandoverBytes || tls.batch.held.size() >= kHeldTensors) {
    tls.batch = Worker::instance().swap(std::move(tls.batch));
  }
}

struct Attach {
  Attach() { at::addGlobalCallback(detaudit::hooks::op_callback(on_start, on_end)); }
} attach;

}  // namespace
