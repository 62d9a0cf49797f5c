// hooks/recorder: the op path: from the RecordFunction callbacks to the OP records, per thread
// (ThreadRecorder) and per process (ProcessRecorder).
//
// The interposer's recorder: RecordFunction callbacks that turn each op into one OP record.
//
// ProcessRecorder holds what one process shares (config, step, program order, rank, its name).
// ThreadRecorder is one thread's op path, lock-free: its frames and its tensor cache. An op's
// inputs are described when it starts (an in-place op is about to change them) and its record
// is written when it ends. Its two parts with one job each: the record sink (hooks/stream:
// buffer, string table, held records, hand-overs) and the collective follower
// (hooks/collectives: receive buffers until their Work completes).
//
// The jobs around it, each in its own file: op_schema (what an op reads and writes),
// phase_tracker (phase, depth, step ends, user scopes), tensor_cache (what was described),
// value_encoding.cpp (inputs and outputs as trace values), stream_identity (names that pair
// across runs), stream_writer (bytes to disk), python_state (what only Python knows).
#pragma once

#include <ATen/record_function.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <typeinfo>
#include <unordered_map>
#include <vector>

#include "capture/op_capture.h"
#include "capture/op_plant.h"
#include "collectives/collective_follower.h"
#include "config/config.h"
#include "digest/digest.h"
#include "ops/op_schema.h"
#include "ops/phase_tracker.h"
#include "ops/torch_compat.h"
#include "process/environment.h"
#include "process/stream_identity.h"
#include "recorder/sentinel_steps.h"
#include "stream/record_sink.h"
#include "tensors/device_digests.h"
#include "tensors/md5_tensor_batch.h"
#include "tensors/remembered_fills.h"
#include "tensors/tensor_cache.h"
#include "trace/records.h"

namespace detaudit::hooks {

// The .status line of outputs a CPU digest described from their op's arguments, not read
// (ThreadRecorder::describe_from_arguments); "" when none.
std::string host_known_outputs_status();
void forget_host_known_outputs_status();  // a forked child counts its own

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
  bool is_dataloader_worker() const { return worker_ == Worker::kYes; }
  // "r<rank>.<role>", claimed with its .status file on first use (stream_identity.h).
  const std::string& process_name();
  void write_status(const std::string& text);
  // The first line of the .status file, written when the name is claimed: at the first record,
  // or at exit. Claiming late lets a launcher's workers take their ranks' names first.
  void note_status(const std::string& text);
  // The rank of the process's first process group, for a process no variable (RANK) or spawn
  // index gave one. Too late to rename a claimed process: its .status says so instead.
  void adopt_group_rank(int64_t rank);

  uint64_t next_order() { return order_.fetch_add(1, std::memory_order_relaxed) + 1; }
  uint64_t step() const { return step_.load(std::memory_order_relaxed); }
  bool step_selected() const { return step_selected_.load(std::memory_order_relaxed); }
  // One of two callbacks is registered at a time. In selected steps the op callback sees every
  // scope, marks included; elsewhere the marks callback sees the user scope only, so libtorch
  // boxes no op's inputs. The other one is removed, not disabled: each time a thread sets its
  // thread-local state (twice for each node the autograd engine runs) libtorch copies the whole
  // global list, disabled entries included, and rebuilds every scope's callbacks from it.
  void set_callbacks(at::RecordFunctionCallback ops, at::RecordFunctionCallback marks);
  // Bumped each time the op callback comes back on: the ops it missed may have changed any
  // tensor a thread's cache describes.
  uint64_t op_callback_epoch() const { return op_callback_epoch_.load(std::memory_order_acquire); }

  // The lean sentinel. A sentinel records what a step leaves: the optimizer's ops and the loss.
  // Once a process has shown both by marks (an optimizer mark, and a `detaudit::backward` mark
  // carrying a loss), its later watched steps run with the op callback off but inside the
  // optimizer's marks, and take the loss from the backward mark: the forward's and backward's
  // ops cost libtorch nothing. Never where collectives tell ranks apart (WORLD_SIZE or
  // SLURM_NTASKS > 1, or a collective seen), where two threads run optimizers (Hogwild: one's
  // window would show the other's ops), nor in a DataLoader worker.
  void saw_optimizer_mark();
  void saw_backward_mark() { backward_marked_.store(true, std::memory_order_relaxed); }
  // A step's state record whose tensors were hashed across torch's intra-op threads.
  void count_spread_step_state() { spread_step_states_.fetch_add(1, std::memory_order_relaxed); }
  void saw_collective();
  // An optimizer mark opens (or closes) the window in which a lean step sees ops.
  void open_optimizer_window();
  void close_optimizer_window();
  // A lean step outside its optimizer window: the loss is the backward mark's.
  bool loss_from_marks() const;
  bool in_optimizer_window() const { return optimizer_window_.load(std::memory_order_relaxed); }
  // A step the sentinel watches (Config::sentinel), not one recorded in full (full_steps).
  bool watched_step(uint64_t step) const;
  // One of several ranks, maybe: a rank variable, a spawn index, WORLD_SIZE or SLURM_NTASKS > 1,
  // or a collective. The replica check reads such a process's optimizer writes one by one.
  bool may_be_a_replica();
  void mark_step_end();
  // Called at the start of each top-level op: begins the next step if one ended, or in a
  // DataLoader worker, the step of the batch it is making.
  void at_top_level_op();
  trace::StepInfo step_info() const;
  // NumPy's and Python's generators as an optimizer step ends (detaudit_note_python_generators):
  // the next STEP record carries them.
  void note_python_generators(uint64_t numpy, uint64_t python);

  void register_thread(ThreadRecorder* t);
  void unregister_thread(ThreadRecorder* t);
  // At exit: close every stream with an END record and wait for the writer.
  void finish_all();
  // For a signal's handler, on the writer thread (it allocates): saves every thread's whole
  // records and appends how the process ended to its .status ("ended: killed by SIGABRT | ...").
  // A crash (SIGABRT, SIGSEGV, ...) ends each saved stream with an END record that names the
  // signal: nothing more would have been recorded. A stop signal (SIGTERM, SIGINT) does so only
  // once the process is exiting; mid-run its streams stay cut. `stopped` is the thread the
  // handler runs on, if it records.
  void save_on_signal(int sig, ThreadRecorder* stopped);
  // A stream whose file could not be created with its header (a full disk): said at exit.
  void note_lost_stream(const std::string& path, int err);
  // exit() has begun, or the Python interpreter is finalizing.
  bool exiting() const;
  void mark_exit_started() { exit_started_.store(true); }
  void write_environment_once();
  // What the environment fingerprint says of this process.
  ProcessFacts facts() const;

  // pthread_atfork: no callback toggles across a fork; in the child, a new role, a fresh order,
  // no inherited threads, and the op callback on (it may be a DataLoader worker).
  void before_fork();
  void after_fork_parent();
  void after_fork_child();
  // A collective on this process group: its ordinal among the groups this process used (in order
  // of first use, the same on every rank that creates its groups in the same order) and the
  // collective's sequence number in it, counted from 1. The first group's rank names a process
  // whose rank nothing else gave (adopt_group_rank).
  void next_collective(const void* group_key, trace::CollectiveInfo* info);

  // Bumped in every forked child: a thread's state from before the fork belongs to the parent.
  uint32_t fork_generation() const { return fork_generation_.load(std::memory_order_relaxed); }

 private:
  // A forked child of a Python program may be a DataLoader worker: its ops are labelled with
  // the step that consumes the batch they make (one batch a step), not the step it forked in.
  enum class Worker : uint8_t { kNo, kMaybe, kYes };

  ProcessRecorder() = default;
  void advance_step();
  void set_step(uint64_t step);
  void write_progress(uint64_t step);
  void refresh_step_state(uint64_t step);
  // With op_callback_mu_ held: the op callback registered (the marks callback not), or the other
  // way.
  void switch_op_callback(bool on);
  void learn_lean_sentinel();
  // For good: every op seen from now on, and the .status says from which step and why.
  void stop_lean_sentinel(const char* why);
  bool lean_step(uint64_t step) const;
  void follow_worker_batch();
  // The step a DataLoader worker's consumer is at, from its .progress file; none if unread.
  std::optional<uint64_t> consumer_step() const;
  std::vector<std::string> closing_status_lines(const std::string& ending);

  bool active_ = false;
  Config config_;
  // A process `detaudit resume` resumed at step K: its step s is the run's step K + s, and
  // the config's steps are the run's (layout::kEnvResumeAt).
  uint64_t resumed_at_ = 0;
  std::string streams_dir_;
  long rank_ = 0;
  bool rank_known_ = false;  // from RANK/LOCAL_RANK, a spawn index or a process group
  std::string role_ = "main";
  std::string process_name_;  // claimed; empty until then
  std::string status_path_;   // its .status file, for a signal handler (no allocation there)
  int progress_fd_ = -1;      // its .progress file, opened by progress_pid_ (a fork reopens)
  pid_t progress_pid_ = 0;
  std::string claim_note_;  // the first line of the .status file when it is claimed
  bool is_python_ = false;
  int forks_ = 0;
  std::atomic<uint64_t> order_{0};
  std::atomic<uint64_t> step_{0};
  std::atomic<bool> step_pending_{false};
  std::atomic<bool> step_selected_{true};
  std::atomic<uint64_t> step_rng_{0};
  std::atomic<uint64_t> numpy_rng_{0}, python_rng_{0};
  std::atomic<bool> env_written_{false};
  std::atomic<uint32_t> fork_generation_{0};
  std::atomic<Worker> worker_{Worker::kNo};  // set on the worker's main thread, read on all
  uint64_t worker_base_step_ = 0;            // the consuming step of the worker's batch 0
  uint64_t worker_epoch_offset_ = 0;         // persistent workers: batches of earlier epochs
  int64_t worker_last_batch_ = -1;
  uintptr_t worker_epoch_ = 0;   // the fetcher of its last batch (python::WorkerBatch)
  std::string parent_progress_;  // a worker's: its consumer's .progress file (write_progress)
  std::mutex claim_mu_;
  std::mutex op_callback_mu_;
  std::optional<at::RecordFunctionCallback> op_callback_, marks_callback_;
  at::CallbackHandle registered_callback_ = 0;  // the one of the two in libtorch's list
  std::atomic<bool> op_callback_on_{true};
  std::atomic<uint64_t> op_callback_epoch_{0};
  std::atomic<bool> optimizer_marked_{false}, backward_marked_{false}, collective_seen_{false};
  std::atomic<pid_t> optimizer_thread_{0};      // the first thread that entered an optimizer mark
  std::atomic<bool> optimizer_threads_{false};  // and then another one
  bool several_ranks_ = false;                  // WORLD_SIZE or SLURM_NTASKS > 1
  std::atomic<bool> lean_{false};               // learned: lean steps from lean_from_ on
  std::atomic<uint64_t> lean_from_{UINT64_MAX};
  std::atomic<uint64_t> spread_step_states_{0};
  std::atomic<bool> optimizer_window_{false};
  std::mutex lean_stop_mu_;
  std::string lean_stop_;                                 // "from step N: why", once stopped
  std::mutex groups_mu_;                                  // taken once per collective
  std::vector<std::pair<const void*, uint64_t>> groups_;  // key, collectives so far
  std::mutex threads_mu_;                                 // taken once per thread, never per op
  std::vector<ThreadRecorder*> threads_;
  std::atomic<bool> exit_started_{false};
  std::mutex lost_mu_;
  std::vector<std::string> lost_streams_;  // "<file>: <why>"
};

class ThreadRecorder {
 public:
  static ThreadRecorder* current();         // this thread's, created on first use
  static ThreadRecorder* current_if_any();  // for signal handlers: never allocates
  ~ThreadRecorder();

  void on_start(const at::RecordFunction& fn);
  void on_end(const at::RecordFunction& fn);
  // Writes the END record and hands everything over; once, whether the thread's end or the
  // process's calls it first.
  void finish();
  StreamBuffer* stream() { return sink_.buffer(); }
  // Its stream file is open: begun, and not ended yet.
  bool stream_open() const { return sink_.started(); }
  // For a stop signal's save, once this thread is out of its buffer for good: the held
  // records whose digests are in, into the buffer to be saved. Waits at most `max_wait_ms` for
  // the digest thread.
  void release_held_for_save(long max_wait_ms = 2000) { sink_.release_held_for_save(max_wait_ms); }
  // For the thread a signal stopped, once its whole records are saved up to `saved`: its held
  // records, if it is out of its buffer, released and appended. Last of all, because releasing
  // them frees memory of its malloc arena, whose lock a thread stopped inside malloc holds.
  void save_held_after(size_t saved) { sink_.save_held_after(saved); }
  // For a signal's save, once this thread's records are saved: its END record naming the signal,
  // when nothing it recorded is still missing. `stopped`: the signal stopped this thread, so
  // whether an op was open on it is known.
  void close_for_signal(int sig, bool exiting, bool stopped);
  // The thread's stream name ("main", "pt_gloo_runloop"), "" before its first record.
  const std::string& stream_thread_name() const { return thread_name_; }
  // The innermost op this thread is inside and records, "" if none; its step in *step.
  std::string open_op(uint64_t* step) const;

 private:
  // A tensor argument captured when the op started, written when it ends.
  struct Snapshot {
    const c10::TensorImpl* key = nullptr;
    uint32_t version = 0;
    bool cacheable = false;
    uint64_t storage_writes = 0;
    int64_t base_id = -1;
    bool written = false;  // written in full by the op: a reference is a TENSOR_WRITTEN
    trace::TensorDesc desc;
    std::shared_ptr<const PendingDigest> pending;  // desc's device digest, while on its way
  };

  // Encoded inputs: raw bytes, or a pointer to a snapshot.
  struct Item {
    bool is_tensor;
    uint32_t begin, end;  // bytes range, or snapshot index in begin
  };

  // One open RecordFunction on this thread: an op, or a mark (PhaseTracker).
  struct Frame {
    uint64_t handle = 0;
    Mark mark = Mark::kOp;
    bool recorded = false;
    bool backward = false;
    uint64_t order = 0, step = 0;
    uint32_t name_id = 0;
    uint32_t scope_id = 0;
    uint8_t bits = 0;
    uint32_t depth = 0;
    bool grad_off = false;  // autograd off as it began: no_grad, inference_mode (an evaluation)
    bool collective = false;
    bool constructor_empty = false;  // an `empty` a tensor constructor fills (OpInfo::layout_arg)
    // An `empty` whose garbage the program may read: a top-level one, or one an enclosing program
    // `empty` runs (DTensor's empty_like on its local tensor). A kernel's own is written by it.
    bool program_empty = false;
    int64_t seq_nr = -1;
    uint64_t rng = 0;
    const OpInfo* info = nullptr;
    size_t items_begin = 0, items_end = 0, bytes_begin = 0, snaps_begin = 0;
    uint64_t batch_adds = 0;  // the device batch's adds() once the op's inputs were added
    // The digest of what this op returns as known_output_of, known from its arguments
    // (OpInfo::known_output): that output is not read.
    std::shared_ptr<const PendingDigest> known_output;
    const c10::TensorImpl* known_output_of = nullptr;
    // The same with a CPU digest: a copy's source as this op read it (its snapshot), or a
    // fill's element, whose digest is remembered (fills_).
    int32_t copy_source_snap = -1;
    uint8_t fill_size = 0;
    uint8_t fill_element[16];
    // Sentinel mode: a top-level forward op, kept only if it returns what a loss looks like.
    bool loss_candidate = false;
    // Sentinel mode: an optimizer op whose tensors join the step's state (StepState).
    bool in_step_state = false;
    // Its arguments it may write and does not return (OpInfo::unreturned_writes), in written_.
    size_t written_begin = 0, written_end = 0;
    // `run --selftest`: the plant target (CaptureSpec) whose value is changed as it ends, or -1.
    int plant = -1;
  };

  // A tensor an op may write and does not return, taken when it starts (its inputs are gone
  // when it ends), and described when it ends. Weak: the program's reference count is its own.
  struct WrittenTensor {
    TensorCache::WeakImpl impl{c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>()};
    uint8_t write = 0;  // its OpInfo::unreturned_writes entry
  };

  ThreadRecorder();
  void open_stream();
  void reset_after_fork();
  const OpInfo& op_info(const at::RecordFunction& fn);
  // `inputs`: what to describe as the op's inputs instead of fn's (a step's state record).
  void begin_op(const at::RecordFunction& fn, Frame& f, trace::Phase phase,
                const std::vector<c10::IValue>* inputs = nullptr);
  // Whether this op is to be recorded (and in which phase), once its OpInfo is known.
  bool recording_wanted(const OpInfo& info, trace::Phase* phase);
  // Sentinel mode (Config::sentinel): the optimizer's top-level ops, and top-level forward ops
  // as loss candidates.
  bool sentinel_wants(Frame& f, trace::Phase phase) const;
  // This op's step is watched by the sentinel, not recorded in full (Config::full_steps).
  bool sentinel_step(const ProcessRecorder& proc) const;
  // Sentinel mode, inside an optimizer step's mark: its ops are not recorded one by one. What
  // they read from before it (the gradients) and what they leave (parameters and state, written
  // or made, alive when the mark ends) are described once, when it ends, as the inputs and
  // outputs of one record named after the mark (SentinelSteps): fewer records and bytes than its
  // ops' own, and what the step leaves, which is all a sentinel compares.
  void open_step_state(const at::RecordFunction& mark);
  void write_step_state(const at::RecordFunction& mark);
  // A `detaudit::backward` mark: its input, if a loss, shows the lean sentinel the loss; in a
  // lean step, recorded as the output of a record named after the op that made the loss when it
  // was last seen (SentinelSteps::loss_maker), else `detaudit::loss` (ProcessRecorder).
  void take_loss_from_mark(const at::RecordFunction& mark);
  // A record no op makes, written at a mark (the loss, a step's state): its frame, at the tops
  // of the stacks, then, once begun, its record with these outputs, popping what it took.
  Frame mark_record_frame(const OpInfo& info, uint32_t depth);
  void write_mark_record(const Frame& f, const std::vector<c10::IValue>& outputs);
  // A record's OpInfo by a name no op has ("detaudit::loss", an optimizer's mark).
  const OpInfo& record_info(const std::string& name);
  // Whether the op enclosing frames_[frame] runs a kernel of its own (unknown: yes) and its
  // nested ops added tensors to the device batch that this kernel may write once they end: all
  // but copies the batch made, and the inputs of an op that writes none of its arguments.
  bool enclosing_kernel_may_write_batch(size_t frame);
  // A fill's or a copy's output digest from its arguments, into f (OpInfo::known_output).
  void know_output(const at::RecordFunction& fn, Frame& f);
  void know_output_on_host(const at::RecordFunction& fn, Frame& f);
  // A CPU digest's output known from its op's arguments (know_output_on_host): true with *desc
  // (and *pending) filled, not read; false where it must be read.
  bool describe_from_arguments(const Frame& f, const at::Tensor& t, trace::TensorDesc* desc,
                               std::shared_ptr<const PendingDigest>* pending);
  void remember_fill(const Frame& f, const trace::TensorDesc& desc);
  // The n-th tensor among the op's captured inputs, null if none.
  const Snapshot* tensor_input(const Frame& f, size_t n) const;
  // Launches the open device batches this op could change the bytes of (Launch).
  void launch_device_batches_before(const at::RecordFunction& fn, const OpInfo& info);
  // `detaudit replay`: saves this op's inputs if it is the one the capture names; for
  // `run --selftest`, marks it as the one to plant in (its arguments watched when
  // `op_arguments`: fn is the op's own, not a mark's).
  void maybe_capture(CaptureSpec& spec, const at::RecordFunction& fn, Frame& f, bool op_arguments);
  // `run --selftest`: the record begun in f ends: its plant, among `outputs` and what it wrote.
  void plant_at_end(const Frame& f, const std::vector<c10::IValue>& outputs);
  // A sentinel's step: a plant in what its op reads and does not write (a gradient, before the
  // optimizer uses it), when the step's state record to come is the target.
  void plant_in_step_state(c10::ArrayRef<const c10::IValue> inputs, uint64_t mutable_args);
  std::vector<std::string> input_digests_now(const Frame& f);  // waits for pending digests

  // Value encoding (value_encoding.cpp): inputs when an op starts, outputs when it ends.
  // How an op uses an argument: OpInfo::overwritten_args are not read, written_args are
  // also written in full.
  enum class Use : uint8_t { kRead, kNotRead, kWrittenInFull };
  void capture_value(const c10::IValue& v, Use use = Use::kRead);
  void capture_tensor(const at::Tensor& t, Use use);
  void flush_bytes_item();
  void emit_tensor(const Snapshot& s, trace::ByteWriter& w);
  // Digest and statistics of t's contents, into desc. A CUDA tensor under the device digest is
  // enqueued on its device, and a small CPU tensor under MD5 joins the thread's batch while
  // the thread is inside its buffer, unless the digest is wanted now (`may_wait` false: shared
  // memory, whose digest the cache compares with the last one seen); `pending` then says when
  // the digest is in. Others are hashed here. Returns the bytes digested.
  uint64_t describe_contents(const at::Tensor& t, trace::TensorDesc* desc,
                             std::shared_ptr<const PendingDigest>* pending, bool may_wait = true);
  // TENSOR_NEW with the next id; a view whose base is out of reach is written as external. A
  // desc whose device digest is still on its way leaves a hole in the record (pending_records.h).
  int64_t write_new(trace::ByteWriter& w, const trace::TensorDesc& desc, int64_t base_id,
                    const std::shared_ptr<const PendingDigest>& pending = nullptr);
  // `scratch`: a partly written workspace (OpInfo::scratch_outputs), described as uninitialized.
  void emit_output(const c10::IValue& v, trace::ByteWriter& w, const Frame& f,
                   bool scratch = false);
  void emit_output_tensor(const at::Tensor& t, trace::ByteWriter& w, const Frame& f, bool scratch);

  // A collective op starts: numbered in its group, followed (collectives_); returns the
  // arguments it overwrites rather than reads.
  uint64_t start_collective(const at::RecordFunction& fn, const OpInfo& info, uint64_t order);
  void emit_pending_output(const c10::IValue& v, trace::ByteWriter& w);
  void emit_received(const at::Tensor& t, const ReceivedBuffers::Described& d, trace::ByteWriter& w,
                     uint64_t op_order);
  // Writes a COLLECTIVE record for each collective whose Work completed; `at_end`: for every
  // one, "not completed" if it has not.
  void write_completed_collectives(bool at_end);

  // Takes the op's unreturned written arguments into written_ (Frame::written_begin/end).
  void take_written_args(const at::RecordFunction& fn, Frame& f);
  // The written section of its record: each one's bytes now that the op has run.
  void emit_written_args(const Frame& f, trace::ByteWriter& w);
  // An op not recorded wrote them: what the cache holds over their storages is void.
  void forget_written_args(const Frame& f);
  void write_record(const Frame& f, const std::vector<c10::IValue>& outputs);
  uint64_t rng_state(const at::RecordFunction& fn);

  uint32_t fork_generation_;
  std::mutex finish_mu_;  // the thread's own end and the process's exit, one after the other
  bool busy_ = false;     // set while the recorder itself runs tensor ops
  bool saw_fake_tensor_ = false;            // an input of the op being captured has no data
  bool compiled_region_in_step_ = false;    // tensors first seen now are likely a region's output
  std::optional<ThreadIdentity> identity_;  // asked at this thread's first op
  std::unordered_map<std::string, uint64_t> capture_seen_;  // a capture's op -> recorded here
  ArgumentWatch plant_watch_;  // the plant target's arguments as it started
  std::string thread_name_;    // claimed with the stream file
  // MD5 of small CPU tensors, batched and hashed on the digest thread; null for other digests.
  // Only inside the buffer (sink_.enter()), so a stop signal's save can run it when the thread
  // is out (release_held_for_save).
  std::unique_ptr<Md5TensorBatch> md5_batch_;
  RecordSink sink_;
  // Device digests: the tensors of the next launch, and records waiting for digests.
  bool device_digest_ = false;
  DeviceBatch device_batch_;
  std::vector<PendingRecords::Hole> holes_;  // of the record being encoded
  // Descriptions made while encoding a value, reused: write_new() copies into the second while
  // its caller holds the first.
  trace::TensorDesc desc_scratch_, desc_copy_;
  RememberedFills<trace::TensorDesc> fills_;  // a CPU digest's (describe_from_arguments)
  uint64_t known_outputs_ = 0;  // outputs described from their arguments (a check samples them)

  // By "name.overload": overloads differ (linspace is composite, linspace.out writes `out`).
  std::unordered_map<std::string, OpInfo> ops_;
  // By name pointer, the fast path: a dispatcher op's name lives in its overload's schema.
  std::unordered_map<const char*, OpInfo*> ops_by_name_ptr_;

  TensorCache cache_;
  int64_t next_tensor_id_ = 0;
  uint64_t top_level_serial_ = 0;
  SentinelSteps sentinel_;

  PhaseTracker phases_;
  std::vector<Frame> frames_;
  size_t depth_ = 0;  // open frames, marks included
  std::vector<Item> items_;
  std::vector<Snapshot> snaps_;
  std::vector<WrittenTensor> written_;           // of open frames
  std::vector<const void*> read_only_storages_;  // enclosing_kernel_may_write_batch's, reused
  size_t snaps_top_ = 0;
  std::string bytes_;  // non-tensor input bytes of open frames
  size_t bytes_item_start_ = 0;

  // What the stream's last records said, which the next ones are written against: a STEP or
  // SCOPE record only when it changes, an OP record's order as the change from the last one.
  struct LastWritten {
    uint64_t step = UINT64_MAX;
    uint32_t scope = UINT32_MAX;
    uint64_t order = 0;
  } last_written_;
  uint32_t scope_id_ = 0;                     // interned scope path of the ops now starting
  uint64_t scope_changes_seen_ = UINT64_MAX;  // PhaseTracker::scope_changes() when interned
  // The step of the last op started on this thread, and the order of that step's first op here.
  struct StepStart {
    uint64_t step = UINT64_MAX;
    uint64_t first_order = 0;
  } step_started_;
  bool unselected_since_clear_ = false;  // ops ran unrecorded: the caches may be stale
  uint64_t op_callback_epoch_ = 0;

  CollectiveFollower collectives_;

  std::unique_ptr<Hasher> hasher_;
};

}  // namespace detaudit::hooks
