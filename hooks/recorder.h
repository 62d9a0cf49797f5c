// The interposer's recorder: RecordFunction callbacks that turn each op into one OP record.
//
// ProcessRecorder holds what one process shares (config, step, program order, rank and role).
// ThreadRecorder holds one thread's stream: its buffer, its string table and its tensor cache,
// so the op path takes no lock. An op's inputs are described when it starts (an in-place op is
// about to change them) and its record is written when it ends.
#pragma once

#include <ATen/record_function.h>
#include <c10/core/UndefinedTensorImpl.h>

#include <array>
#include <atomic>
#include <memory>
#include <memory_resource>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "config/config.h"
#include "digest/digest.h"
#include "stream_writer.h"
#include "torch_compat.h"
#include "trace/records.h"

namespace detaudit::hooks {

class ThreadRecorder;

class ProcessRecorder {
 public:
  static ProcessRecorder& instance();

  // Reads the resolved config and prepares the streams directory; false if not recording.
  bool init(const std::string& run_dir, const Config& config, std::string* error);
  bool active() const { return active_; }
  const Config& config() const { return config_; }
  const std::string& streams_dir() const { return streams_dir_; }
  long rank() const { return rank_; }
  const std::string& role() const { return role_; }
  bool is_python() const { return is_python_; }

  uint64_t next_order() { return order_.fetch_add(1, std::memory_order_relaxed) + 1; }
  uint64_t step() const { return step_.load(std::memory_order_relaxed); }
  bool step_selected() const { return step_selected_.load(std::memory_order_relaxed); }
  // One of two callbacks is on at a time. In selected steps the op callback sees every scope,
  // marks included; elsewhere the marks callback sees the user scope only, so libtorch boxes no
  // op's inputs.
  void set_callbacks(at::CallbackHandle ops, at::CallbackHandle marks);
  // Bumped each time the op callback comes back on: the ops it missed may have changed any
  // tensor a thread's cache describes.
  uint64_t op_callback_epoch() const { return op_callback_epoch_.load(std::memory_order_acquire); }
  void mark_step_end();
  // Called at the start of each top-level op: begins the next step if one ended.
  void maybe_advance_step();
  trace::StepInfo step_info() const;

  uint32_t new_thread_index() { return next_thread_.fetch_add(1); }
  void register_thread(ThreadRecorder* t);
  void unregister_thread(ThreadRecorder* t);
  // At exit: close every stream with an END record and wait for the writer.
  void finish_all();
  void write_environment_once();

  // In a forked child: a new role, a fresh order, no inherited threads.
  void after_fork_child();
  void before_fork() { ++forks_; }
  // Bumped in every forked child: a thread's state from before the fork belongs to the parent.
  uint32_t fork_generation() const { return fork_generation_.load(std::memory_order_relaxed); }

 private:
  ProcessRecorder() = default;
  void advance_step();
  void refresh_step_state(uint64_t step);

  bool active_ = false;
  Config config_;
  std::string streams_dir_;
  long rank_ = 0;
  std::string role_ = "main";
  bool is_python_ = false;
  int forks_ = 0;
  std::atomic<uint64_t> order_{0};
  std::atomic<uint64_t> step_{0};
  std::atomic<bool> step_pending_{false};
  std::atomic<bool> step_selected_{true};
  std::atomic<uint64_t> step_rng_{0};
  std::atomic<uint32_t> next_thread_{0};
  std::atomic<bool> env_written_{false};
  std::atomic<uint32_t> fork_generation_{0};
  std::mutex op_callback_mu_;
  at::CallbackHandle op_callback_ = 0, marks_callback_ = 0;
  std::atomic<bool> op_callback_on_{true};
  std::atomic<uint64_t> op_callback_epoch_{0};
  std::mutex threads_mu_;  // taken once per thread, never per op
  std::vector<ThreadRecorder*> threads_;
};

class ThreadRecorder {
 public:
  static ThreadRecorder* current();  // this thread's, created on first use
  ~ThreadRecorder();

  void on_start(const at::RecordFunction& fn);
  void on_end(const at::RecordFunction& fn);
  // Writes the END record and hands everything over.
  void finish();
  StreamBuffer* stream() { return &stream_; }

 private:
  enum class Marker : uint8_t { kNone, kOptimizerStep, kOptimizerOther, kStep, kBackwardNode };

  struct OpInfo {
    std::string name;
    uint32_t name_id = 0;
    bool selected = true;
    bool is_view = false;
    bool is_random = false;
    bool returns_uninitialized = false;  // empty, resize_: bytes no op wrote
    bool writes = false;  // writes an argument in place (`Tensor(a!)`)
    bool metadata_only = false;  // in place on sizes and strides only (as_strided_, t_, ...)
    bool compiled_region = false;  // a torch.compile region: its kernels are not seen
    bool repoints_storage = false;  // set_: the output's bytes are another storage's
    uint64_t scratch_outputs = 0;  // outputs (by index) that are partly written scratch space
    // Implemented only through other ops (a Composite kernel): its outputs are what its nested
    // ops described. A backend kernel may write its outputs directly after a nested op ran
    // (addmm copies the bias with copy_, then a GEMM adds the product in place).
    bool composite = false;
    // Arguments (by index, up to 64) the op overwrites without reading: out= tensors, and self
    // of zero_, fill_, copy_, resize_ and the random fills. Their old bytes are not hashed.
    uint64_t overwritten_args = 0;
  };

  // The last recorded write to a storage. A write through any alias (e.g. `p.data.add_()`, whose
  // version counter is not p's) bumps `writes`, which retires every cache entry on the storage.
  struct CacheEntry;
  struct StorageEntry {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage{c10::intrusive_ptr<c10::StorageImpl>()};
    uint64_t writes = 0;
    uint32_t version = 0;  // of the tensor last written here
    int64_t id = -1;       // its tensor id, once written
    struct CacheEntry* last = nullptr;  // its description
    // Other geometries of the same bytes described since the last write (w.t() each timestep).
    struct View {
      uint64_t writes = UINT64_MAX;
      int64_t offset = 0;
      trace::TensorDesc desc;
    };
    std::array<View, 2> views;
    uint8_t next_view = 0;
  };

  // One tensor version this stream has described.
  using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  struct CacheEntry {
    WeakImpl impl{c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>()};
    uint32_t version = 0;
    int64_t id = -1;             // -1: described, not written yet
    uint64_t external_serial = 0;  // for tensors that entered from outside: valid in this op only
    StorageEntry* storage = nullptr;
    uint64_t storage_writes = 0;
    int64_t storage_offset = 0;
    int64_t base_id = -1;  // for views
    uint64_t written_order = 0;  // order of the op whose output it is; 0 when seen as an input
    uint64_t top_level_serial = 0;  // the top-level op during which it was described
    trace::TensorDesc desc;
  };

  // A tensor argument captured when the op started, written when it ends.
  struct Snapshot {
    const c10::TensorImpl* key = nullptr;
    uint32_t version = 0;
    bool cacheable = false;
    uint64_t storage_writes = 0;
    int64_t base_id = -1;
    trace::TensorDesc desc;
  };

  // Encoded inputs: raw bytes, or a pointer to a snapshot.
  struct Item {
    bool is_tensor;
    uint32_t begin, end;  // bytes range, or snapshot index in begin
  };

  struct Frame {
    uint64_t handle = 0;
    Marker marker = Marker::kNone;
    bool recorded = false;
    bool backward = false;
    uint64_t order = 0, step = 0;
    uint32_t name_id = 0;
    uint8_t bits = 0;
    uint32_t depth = 0;
    int64_t seq_nr = -1;
    uint64_t rng = 0;
    const OpInfo* info = nullptr;
    size_t items_begin = 0, items_end = 0, bytes_begin = 0, snaps_begin = 0;
  };

  ThreadRecorder();
  void open_stream();
  void reset_after_fork();
  const OpInfo& op_info(const at::RecordFunction& fn);
  OpInfo make_op_info(const char* name, const OptionalOperatorName& op_name);
  uint32_t intern(std::string_view s);
  trace::Phase current_phase() const;

  // `overwritten`: the op writes this argument without reading it (OpInfo::overwritten_args).
  void capture_value(const c10::IValue& v, bool overwritten = false);
  void capture_tensor(const at::Tensor& t, bool overwritten);
  void flush_bytes_item();
  void emit_tensor(const Snapshot& s, trace::ByteWriter& w);
  // TENSOR_NEW with the next id; a view whose base is out of reach is written as external.
  int64_t write_new(trace::ByteWriter& w, const trace::TensorDesc& desc, int64_t base_id);
  // `scratch`: a partly written workspace (OpInfo::scratch_outputs), described as uninitialized.
  void emit_output(const c10::IValue& v, trace::ByteWriter& w, const Frame& f, bool scratch = false);
  void emit_output_tensor(const at::Tensor& t, trace::ByteWriter& w, const Frame& f, bool scratch);
  void emit_string_records();
  void write_record(const Frame& f, const at::RecordFunction& fn);
  void after_record();
  uint64_t rng_state(const at::RecordFunction& fn);
  void clear_caches();
  void make_room();  // drops dead entries when the cache is full
  StorageEntry* storage_of(const at::Tensor& t);
  // A fresh cache entry for this tensor version, described by `desc`.
  CacheEntry& remember(const at::Tensor& t, uint32_t version, const trace::TensorDesc& desc);
  // The cache entry for this tensor's current version, or nullptr.
  CacheEntry* lookup(const at::Tensor& t, uint32_t version, bool allow_external);

  uint32_t fork_generation_;
  bool busy_ = false;  // set while the recorder itself runs tensor ops
  bool saw_fake_tensor_ = false;  // an input of the op being captured has no data
  bool compiled_region_in_step_ = false;  // tensors first seen now are likely a region's output
  bool stream_open_ = false;
  uint32_t thread_index_ = 0;
  StreamBuffer stream_;
  trace::RecordEncoder encoder_;         // op records
  trace::RecordEncoder string_encoder_;  // string records, written while an op body is open
  std::string body_;  // the record being built

  // By "name.overload": overloads differ (linspace is composite, linspace.out writes `out`).
  std::unordered_map<std::string, OpInfo> ops_;
  // By name pointer, the fast path: a dispatcher op's name lives in its overload's schema.
  std::unordered_map<const char*, OpInfo*> ops_by_name_ptr_;
  std::unordered_map<std::string, uint32_t> strings_;
  std::vector<std::string> pending_strings_;  // interned, not yet written

  // The caches gain and lose entries on most ops: their nodes come from a pool, not malloc. The
  // pool is declared first so that it outlives them.
  std::pmr::unsynchronized_pool_resource cache_memory_;
  std::pmr::unordered_map<const c10::TensorImpl*, CacheEntry> cache_{&cache_memory_};
  std::pmr::unordered_map<const c10::StorageImpl*, StorageEntry> storages_{&cache_memory_};
  int64_t next_tensor_id_ = 0;
  uint64_t top_level_serial_ = 0;
  bool rehash_inputs_ = false;

  std::vector<Frame> frames_;
  size_t depth_ = 0;     // open frames, markers included
  size_t op_depth_ = 0;  // open op frames: the depth recorded in OP records
  std::vector<Item> items_;
  std::vector<Snapshot> snaps_;
  size_t snaps_top_ = 0;
  std::string bytes_;          // non-tensor input bytes of open frames
  size_t bytes_item_start_ = 0;

  int backward_depth_ = 0;
  int optimizer_depth_ = 0;       // inside any optimizer mark
  int optimizer_step_depth_ = 0;  // inside Optimizer.step, where a closure may run forward
  bool backward_seen_in_step_ = false;
  uint64_t last_step_written_ = UINT64_MAX;
  uint64_t step_started_ = UINT64_MAX;   // the step of the last op started on this thread
  uint64_t step_first_order_ = 0;        // the order of that step's first op here
  bool unselected_since_clear_ = false;  // ops ran unrecorded: the caches may be stale
  uint64_t op_callback_epoch_ = 0;
  uint64_t last_order_written_ = 0;
  uint64_t records_since_handover_ = 0;
  uint64_t last_handover_ns_ = 0;

  std::unique_ptr<Hasher> hasher_;
  trace::EndInfo totals_;
};

}  // namespace detaudit::hooks
