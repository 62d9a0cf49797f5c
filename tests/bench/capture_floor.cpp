// What the op's thread would still spend if the recorder did its describing, caching, hashing
// and encoding on another core: for each tensor an op reads or returns, its identity, version
// and geometry, and a copy of its bytes when they are small (the program may change them
// before another core reads them), appended to the thread's buffer; a full buffer goes to a
// worker thread, which hashes the copied bytes (XXH3) and nothing else.
//
// Not a recorder. A direct-mapped table of the tensor versions already copied stands for the
// cache the op's thread would keep (DETAUDIT_BENCH_CAPTURE_SEEN=off drops it: every small
// tensor copied each time an op names it). For the bench's workloads only: a forked child has
// no worker thread. Preloaded by bench.py
// as the mode "floor: capture only, hashed on another core"; docs/performance.md compares it
// with the empty callback (callback_floor.cpp) and the interposer.
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t kCopyBytes = 64 * 1024;      // larger tensors: geometry only
constexpr size_t kHandoverBytes = 256 * 1024;
constexpr size_t kBufferBytes = kHandoverBytes + kCopyBytes + 4096;

struct TensorHead {
  const void* impl;
  const void* storage;
  uint32_t version;
  uint8_t dtype, dims;
  int64_t offset;
  int64_t sizes[6], strides[6];
  uint32_t copied;  // bytes that follow the head
};

class Worker {
 public:
  static Worker& instance() {
    static Worker* w = new Worker();  // never destroyed: threads may hand over at exit
    return *w;
  }
  // Takes a full buffer; gives back an empty one, waiting for the worker if it has none: a
  // fixed set of buffers, made once, so that no hand-over maps fresh memory.
  std::string swap(std::string&& full) {
    std::unique_lock<std::mutex> lock(mu_);
    queue_.push_back(std::move(full));
    cv_.notify_one();
    spare_cv_.wait(lock, [this] { return !spare_.empty(); });
    std::string empty = std::move(spare_.back());
    spare_.pop_back();
    empty.clear();
    return empty;
  }

 private:
  Worker() {
    for (int i = 0; i < 8; ++i) {
      spare_.emplace_back();
      spare_.back().reserve(kBufferBytes);
    }
    std::thread([this] { loop(); }).detach();
  }
  void loop() {
    for (;;) {
      std::string buf;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        buf = std::move(queue_.back());
        queue_.pop_back();
      }
      uint64_t h = 0;
      for (size_t at = 0; at + sizeof(TensorHead) <= buf.size();) {
        TensorHead head;
        std::memcpy(&head, buf.data() + at, sizeof head);
        at += sizeof head;
        h ^= XXH3_64bits(buf.data() + at, head.copied);
        at += head.copied;
      }
      sink_.fetch_xor(h, std::memory_order_relaxed);  // kept, so the hashing is not optimized away
      std::lock_guard<std::mutex> lock(mu_);
      spare_.push_back(std::move(buf));
      spare_cv_.notify_one();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, spare_cv_;
  std::vector<std::string> queue_, spare_;
  std::atomic<uint64_t> sink_{0};
};

struct ThreadBuffer {
  std::string bytes;
  // Tensor versions whose bytes were copied already, direct-mapped: a lower bound on what an
  // op-thread cache costs (it ignores address reuse and writes through aliases, which a real
  // one must not).
  struct Seen {
    const void* impl = nullptr;
    uint32_t version = 0;
  };
  std::vector<Seen> seen = std::vector<Seen>(4096);
  ThreadBuffer() { bytes.reserve(kBufferBytes); }
};
// initial-exec, as the interposer's: preloaded, never dlopen'ed late.
__attribute__((tls_model("initial-exec"))) thread_local ThreadBuffer tls;
// DETAUDIT_BENCH_CAPTURE_SEEN=off copies every small tensor each time an op names it.
const bool remember_seen = [] {
  const char* v = std::getenv("DETAUDIT_BENCH_CAPTURE_SEEN");
  return !(v && std::string(v) == "off");
}();

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
      tls.bytes.append(reinterpret_cast<const char*>(&head), sizeof head);
      return;
    }
    s.impl = impl;
    s.version = head.version;
  }
  if (!impl->has_storage() || !t.is_cpu()) {
    tls.bytes.append(reinterpret_cast<const char*>(&head), sizeof head);
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
  if (span > kCopyBytes || t.dim() > 6) {
    tls.bytes.append(reinterpret_cast<const char*>(&head), sizeof head);
    return;
  }
  head.copied = uint32_t(span);
  tls.bytes.append(reinterpret_cast<const char*>(&head), sizeof head);
  tls.bytes.append(static_cast<const char*>(t.data_ptr()), span);
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
  if (tls.bytes.size() >= kHandoverBytes) {
    tls.bytes = Worker::instance().swap(std::move(tls.bytes));
  }
}

struct Attach {
  Attach() {
    at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                              .needsInputs(true)
                              .needsOutputs(true)
                              .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                                       at::RecordScope::TORCHSCRIPT_FUNCTION,
                                       at::RecordScope::CUSTOM_CLASS, at::RecordScope::USER_SCOPE}));
  }
} attach;

}  // namespace
