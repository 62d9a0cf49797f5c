// ThreadRecorder: one thread's op path, from the RecordFunction callbacks to the OP records in
// its stream buffer.
#include "recorder/recorder.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <typeinfo>

#include "digest/tensor_digester.h"
#include "ops/rng_source.h"
#include "process/environment.h"
#include "process/stream_identity.h"
#include "recorder/scoped.h"
#include "run_layout.h"
#include "tensors/tensor_digest.h"
#include "trace/records.h"
#include "util/balance.h"
#include "util/check.h"

namespace detaudit::hooks {

using trace::ByteWriter;
using trace::ValueType;

namespace {

// DETAUDIT_MD5_BATCH=off hashes every small tensor alone when the op reaches it: the same trace,
// for tests that compare the two, and benchmarks.
// DETAUDIT_MD5_BATCH (docs/config.md): "off", "digest-thread", or unset.
std::string md5_batch_setting() {
  const char* v = std::getenv("DETAUDIT_MD5_BATCH");
  return v ? v : "";
}

// The thread's MD5 batch, when the config's digest is MD5 and this CPU batches it.
std::unique_ptr<Md5TensorBatch> md5_batch_for(const Config& config) {
  static const std::string setting = md5_batch_setting();
  if (config.digest == trace::DigestAlgo::kMd5 && Md5Batch::available() && setting != "off")
    return std::make_unique<Md5TensorBatch>(setting != "digest-thread");
  return nullptr;
}

// With DETAUDIT_DEBUG set, says once per op why it could not be recorded. Only then is the
// message asked for: a c10::Error's what() symbolizes its backtrace, milliseconds each.
void report_swallowed(const char* op, const std::exception& e) {
  static const bool debug = std::getenv("DETAUDIT_DEBUG") != nullptr;
  if (!debug) return;
  thread_local std::unordered_map<std::string, bool> seen;
  if (!seen[op]) {
    seen[op] = true;
    std::fprintf(stderr, "detaudit: debug: %s not recorded: %s\n", op, e.what());
  }
}

bool is_optimizer_mark(Mark mark) {
  return mark == Mark::kOptimizerStep || mark == Mark::kOptimizerOther;
}

// An op that made a FakeTensor (aten::empty under torch.compile's FakeTensorMode).
template <typename Outputs>
bool produced_fake_tensor(const Outputs& outputs) {
  for (const c10::IValue& v : outputs) {
    if (v.isTensor() && v.toTensor().defined() && has_no_data(v.toTensor())) return true;
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList())
        if (t.defined() && has_no_data(t)) return true;
  }
  return false;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ThreadRecorder

namespace {
// initial-exec: read on every op, and the library is preloaded, never dlopen'ed late.
__attribute__((tls_model("initial-exec"))) thread_local ThreadRecorder* tls_recorder = nullptr;
__attribute__((tls_model("initial-exec"))) thread_local bool tls_destroyed = false;
struct ThreadRecorderHolder {
  std::unique_ptr<ThreadRecorder> recorder;
  ~ThreadRecorderHolder() {
    tls_recorder = nullptr;
    tls_destroyed = true;
  }
};
thread_local ThreadRecorderHolder tls_holder;
}  // namespace

ThreadRecorder* ThreadRecorder::current_if_any() { return tls_recorder; }

ThreadRecorder* ThreadRecorder::current() {
  if (tls_recorder) return tls_recorder;
  if (tls_destroyed) return nullptr;  // thread exit: ops after our destructor go unrecorded
  tls_holder.recorder.reset(new ThreadRecorder());
  tls_recorder = tls_holder.recorder.get();
  return tls_recorder;
}

ThreadRecorder::ThreadRecorder()
    : fork_generation_(ProcessRecorder::instance().fork_generation()),
      md5_batch_(md5_batch_for(ProcessRecorder::instance().config())),
      sink_(md5_batch_.get()),
      cache_(ProcessRecorder::instance().config().rehash_inputs) {
  hasher_ = std::make_unique<Hasher>(ProcessRecorder::instance().config().digest);
  device_digest_ = ProcessRecorder::instance().config().digest == trace::DigestAlgo::kDevice;
  frames_.resize(64);
  ProcessRecorder::instance().register_thread(this);
}

ThreadRecorder::~ThreadRecorder() {
  // Ended while still registered: a process exiting meanwhile (a DataLoader worker leaves
  // without joining its queue's feeder thread) waits in finish_all for this END, rather than
  // ending before it is written.
  if (fork_generation_ == ProcessRecorder::instance().fork_generation()) finish();
  ProcessRecorder::instance().unregister_thread(this);
}

void ThreadRecorder::finish() {
  std::lock_guard<std::mutex> lock(finish_mu_);
  if (collectives_.any_pending()) write_completed_collectives(/*at_end=*/true);
  if (!sink_.started()) return;
  InBuffer in_buffer = sink_.enter();
  if (!in_buffer.entered()) return;
  if (md5_batch_) md5_batch_->run();
  device_batch_.launch(Launch::kThreadEnd);
  if (sink_.holding()) drain_device_digests();
  sink_.end();  // a later op on this thread would start a second stream file
}

void ThreadRecorder::reset_after_fork() {
  // Everything here describes the parent's stream: the child starts its own.
  fork_generation_ = ProcessRecorder::instance().fork_generation();
  new (&finish_mu_) std::mutex();  // the parent may have been ending another thread
  sink_.reset_after_fork();
  device_batch_.forget_after_fork();
  thread_name_.clear();
  identity_.reset();
  capture_seen_.clear();
  sentinel_ = SentinelSteps{};
  for (auto& [name, info] : ops_) info.name_id = UINT32_MAX;
  cache_.clear();
  next_tensor_id_ = 0;
  last_written_ = LastWritten{};
  scope_changes_seen_ = UINT64_MAX;  // the string table starts afresh
  collectives_.clear();
  ProcessRecorder::instance().register_thread(this);
}

void ThreadRecorder::open_stream() {
  ProcessRecorder& proc = ProcessRecorder::instance();
  const std::string process = proc.process_name();
  const int fd = create_exclusive(proc.streams_dir(), layout::stream_name(process, identity_->name),
                                  layout::kTraceExt, &thread_name_);
  thread_name_ = thread_name_.substr(std::min(thread_name_.size(), process.size() + 3));
  trace::StreamHeader h;
  h.algo = proc.config().digest;
  h.rank = proc.rank();
  h.pid = uint64_t(::getpid());
  h.process_role = process.substr(process.find('.') + 1);
  h.thread = thread_name_;
  if (proc.is_dataloader_worker()) h.flags |= trace::kStreamDataLoaderWorker;
  h.unix_ns = uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count());
  // When the disk refuses the header, the file goes and the stream is not recorded.
  if (!sink_.start(fd, h)) {
    const int err = errno;
    const std::string path = proc.streams_dir() + "/" + layout::stream_name(process, thread_name_) +
                             layout::kTraceExt;
    ::unlink(path.c_str());
    proc.note_lost_stream(path, err);
  }
  proc.write_environment_once();
}

const OpInfo& ThreadRecorder::op_info(const at::RecordFunction& fn) {
  const char* name = fn.name();
  auto fast = ops_by_name_ptr_.find(name);
  // Other records name themselves with short-lived strings: a reused address must match too.
  if (fast != ops_by_name_ptr_.end() && std::strcmp(fast->second->name.c_str(), name) == 0) {
    OpInfo& info = *fast->second;
    if (info.name_id == UINT32_MAX) info.name_id = sink_.intern(name);
    return info;
  }
  auto op_name = fn.operator_name();
  std::string key = op_name ? op_name->name + "." + op_name->overload_name : std::string(name);
  auto it = ops_.find(key);
  if (it == ops_.end()) {
    const bool selected = ProcessRecorder::instance().config().select.wants_op(name);
    it = ops_.emplace(key, describe_op(name, op_name, selected)).first;
    it->second.name_id = UINT32_MAX;
  }
  if (it->second.name_id == UINT32_MAX) it->second.name_id = sink_.intern(name);
  ops_by_name_ptr_[name] = &it->second;
  return it->second;
}

namespace {

RngSource rng_source_of(const at::RecordFunction& fn) {
  auto inputs = fn.inputs();
  return rng_source(inputs.size(), [&](size_t i) {
    const c10::IValue& v = inputs[i];
    RngArg a;
    if (v.isGenerator()) {
      a.what = RngArg::What::kGenerator;
    } else if (v.isTensor() && v.toTensor().defined()) {
      a.what = RngArg::What::kTensor;
      a.device_type = int(v.toTensor().device().type());
      a.device_index = v.toTensor().device().index();
    } else if (v.isDevice()) {
      a.what = RngArg::What::kDevice;
      a.device_type = int(v.toDevice().type());
      a.device_index = v.toDevice().index();
    }
    return a;
  });
}

// The generator itself, for a capture: null where reading it would start CUDA.
std::optional<at::Generator> generator_of(const at::RecordFunction& fn) {
  const RngSource source = rng_source_of(fn);
  switch (source.kind) {
    case RngSource::Kind::kExplicit: return fn.inputs()[source.arg].toGenerator();
    case RngSource::Kind::kCuda:
      if (source.from_device_arg && !cuda_initialized()) return std::nullopt;
      return at::globalContext().defaultGenerator(
          c10::Device(c10::kCUDA, c10::DeviceIndex(source.device_index)));
    case RngSource::Kind::kCpu: break;
  }
  return at::globalContext().defaultGenerator(c10::Device(c10::kCPU));
}

}  // namespace

uint64_t ThreadRecorder::rng_state(const at::RecordFunction& fn) {
  const RngSource source = rng_source_of(fn);
  switch (source.kind) {
    case RngSource::Kind::kExplicit: return generator_digest(fn.inputs()[source.arg].toGenerator());
    case RngSource::Kind::kCuda:
      // A CUDA tensor means CUDA is up. A Device argument alone does not (a C++ program's first
      // torch::rand(..., kCUDA) starts it inside the op): reading the generator then would start it.
      if (source.from_device_arg && !cuda_initialized()) return 0;
      return cuda_rng_digest(source.device_index);
    case RngSource::Kind::kCpu: break;
  }
  return default_rng_digest();
}

void ThreadRecorder::on_start(const at::RecordFunction& fn) {
  if (busy_) return;
  if (fork_generation_ != ProcessRecorder::instance().fork_generation()) reset_after_fork();
  ProcessRecorder& proc = ProcessRecorder::instance();
  // Before this op can read a buffer a collective filled.
  if (collectives_.any_pending()) write_completed_collectives(/*at_end=*/false);

  if (depth_ == frames_.size()) frames_.resize(frames_.size() * 2);
  Frame& f = frames_[depth_];
  f = Frame{};
  f.handle = fn.handle();
  f.depth = phases_.op_depth();
  f.items_begin = f.items_end = items_.size();
  f.bytes_begin = bytes_.size();
  f.snaps_begin = snaps_top_;
  f.written_begin = f.written_end = written_.size();
  ++depth_;

  f.mark = PhaseTracker::classify(fn);
  if (f.mark != Mark::kOp) {
    if (f.mark == Mark::kOptimizerStep && phases_.at_top_level_optimizer_step())
      proc.at_top_level_op();
    if (is_optimizer_mark(f.mark)) {
      proc.saw_optimizer_mark();
      // zero_grad's ops write only gradients, which the optimizer's ops read: not opened for
      // them (each window costs libtorch a rebuild of its callback lists on every thread).
      if (phases_.outside_optimizer() &&
          std::string_view(fn.name()).rfind("Optimizer.zero_grad#", 0) != 0) {
        proc.open_optimizer_window();
        open_step_state(fn);
      }
    }
    if (f.mark == Mark::kBackwardFrom) take_loss_from_mark(fn);
    phases_.enter(f.mark, fn.name());
    // The label opens inside the step and closes before its state is written: kept for it.
    if (f.mark == Mark::kUserScope && sentinel_.step_open() &&
        std::string_view(fn.name()).substr(0, trace::kOptimizerStepLabel.size()) ==
            trace::kOptimizerStepLabel)
      sentinel_.label_step(phases_.scope_path());
    return;
  }
  if (phases_.outside_backward_and_optimizer() && f.depth == 0) proc.at_top_level_op();
  f.backward = fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
  phases_.enter_op(f.backward);
  if (!proc.step_selected()) {
    unselected_since_clear_ = true;  // writes we do not see: start afresh when recording resumes
    return;
  }
  if (unselected_since_clear_ || op_callback_epoch_ != proc.op_callback_epoch()) {
    cache_.clear();
    unselected_since_clear_ = false;
    op_callback_epoch_ = proc.op_callback_epoch();
  }
  const OpInfo& info = op_info(fn);
  f.info = &info;
  // Recorded or not, what it writes beside its returns must be seen when it ends.
  if (!info.unreturned_writes.empty()) take_written_args(fn, f);
  trace::Phase phase;
  if (recording_wanted(info, &phase)) {
    if (!sentinel_step(proc)) {
      begin_op(fn, f, phase);
    } else if (sentinel_.step_open() && f.depth == 0 && phase == trace::Phase::kOptimizer &&
               !info.collective.defined()) {
      f.in_step_state = true;
      auto inputs = fn.inputs();
      if (capture_spec()) plant_in_step_state(inputs, info.mutable_args);
      for (size_t i = 0; i < inputs.size(); ++i)
        sentinel_.note(inputs[i], i < 64 && (info.mutable_args >> i & 1));
    } else if (sentinel_wants(f, phase)) {
      begin_op(fn, f, phase);
    }
  }
  // Recorded or not, the op must not write bytes an open batch is still to digest.
  if (device_digest_) {
    launch_device_batches_before(fn, info);
    f.batch_adds = device_batch_.adds();
  }
}

bool ThreadRecorder::enclosing_kernel_may_write_batch(size_t frame) {
  for (size_t k = frame; k-- > 0;) {
    const Frame& e = frames_[k];
    if (e.mark != Mark::kOp) continue;
    if ((e.info && !e.info->own_kernel) || device_batch_.adds() <= e.batch_adds) return false;
    // Its kernel writes what it returns and what it may write by its schema; addmm's nested
    // copy_ of the bias reads its `self`, which it may not.
    read_only_storages_.clear();
    if (e.recorded && e.info && !e.info->mutable_args)
      for (size_t i = e.items_begin; i < e.items_end; ++i)
        if (items_[i].is_tensor) {
          // unsafe_: a wrapper subclass's storage throws where read; its impl is null.
          const c10::StorageImpl* storage =
              snaps_[items_[i].begin].key->unsafe_storage().unsafeGetStorageImpl();
          if (storage) read_only_storages_.push_back(storage);
        }
    return !device_batch_.added_since_reads_only(e.batch_adds, read_only_storages_);
  }
  return false;
}

const ThreadRecorder::Snapshot* ThreadRecorder::tensor_input(const Frame& f, size_t n) const {
  for (size_t i = f.items_begin; i < f.items_end; ++i)
    if (items_[i].is_tensor && n-- == 0) return &snaps_[items_[i].begin];
  return nullptr;
}

namespace {

// Dense tensors only: a sparse, nested or quantized one's bytes are not its elements, and a
// conjugate or negative view's are not its values.
bool plain(const at::Tensor& t) {
  return t.defined() && t.layout() == at::kStrided && !t.is_nested() && !t.is_quantized() &&
         !t.is_conj() && !t.is_neg();
}

// A copy whose output holds its source's elements in their order, as the source was read.
bool copies_elements(const at::Tensor& self, const at::Tensor& src) {
  return plain(src) && src.scalar_type() == self.scalar_type() && src.device() == self.device() &&
         src.sizes().equals(self.sizes()) && at::has_internal_overlap(self) == at::MemOverlap::No;
}

}  // namespace

void ThreadRecorder::know_output(const at::RecordFunction& fn, Frame& f) {
  auto inputs = fn.inputs();
  if (inputs.empty() || !inputs[0].isTensor()) return;
  const at::Tensor& self = inputs[0].toTensor();
  if (!plain(self) || self.numel() == 0 || !digests_on_device(self)) return;
  const bool stats = ProcessRecorder::instance().config().stats;
  switch (f.info->known_output) {
    case KnownOutput::kNone: return;
    case KnownOutput::kZero:
      f.known_output = device_batch_.digest_of_fill(self, c10::Scalar(0), stats);
      break;
    case KnownOutput::kFill:
      if (inputs.size() > 1 && inputs[1].isScalar())
        f.known_output = device_batch_.digest_of_fill(self, inputs[1].toScalar(), stats);
      break;
    case KnownOutput::kCopy: {
      // The same bytes in the same logical order: the source's digest, as this op read it.
      if (inputs.size() < 2 || !inputs[1].isTensor()) return;
      const at::Tensor& src = inputs[1].toTensor();
      if (!copies_elements(self, src)) return;
      const Snapshot* read = tensor_input(f, 1);
      if (!read || read->key != src.unsafeGetTensorImpl() || !read->pending ||
          read->desc.not_read())
        return;
      f.known_output = read->pending;
      note_copy_described_by_source();
      break;
    }
  }
  if (f.known_output) f.known_output_of = self.unsafeGetTensorImpl();
}

void ThreadRecorder::know_output_on_host(const at::RecordFunction& fn, Frame& f) {
  auto inputs = fn.inputs();
  if (inputs.empty() || !inputs[0].isTensor()) return;
  const at::Tensor& self = inputs[0].toTensor();
  if (!plain(self) || self.numel() == 0 || !self.is_cpu()) return;
  if (f.info->known_output == KnownOutput::kCopy) {
    // Its source's digest as this op read it: not when they overlap (the copy changes what it
    // reads), nor where the read was geometry only.
    if (inputs.size() < 2 || !inputs[1].isTensor()) return;
    const at::Tensor& src = inputs[1].toTensor();
    if (!copies_elements(self, src) ||
        at::get_overlap_status(self, src) != at::MemOverlapStatus::No)
      return;
    const Snapshot* read = tensor_input(f, 1);
    if (!read || read->key != src.unsafeGetTensorImpl() || !read->desc.has_contents() ||
        (!read->pending && read->desc.digest_len == 0))
      return;
    f.copy_source_snap = int32_t(read - snaps_.data());
  } else {
    c10::Scalar value(0);
    if (f.info->known_output == KnownOutput::kFill) {
      if (inputs.size() < 2 || !inputs[1].isScalar()) return;
      value = inputs[1].toScalar();
    }
    size_t size = 0;
    try {
      size = fill_element(value, self.scalar_type(), f.fill_element);
    } catch (const std::exception&) {
      return;  // out of the dtype's range: the fill itself fails
    }
    if (size == 0 || size != size_t(self.element_size())) return;
    f.fill_size = uint8_t(size);
  }
  f.known_output_of = self.unsafeGetTensorImpl();
}

namespace {

// Outputs a CPU digest described from their arguments, not read (host_known_outputs_status).
std::atomic<uint64_t> g_fills_known{0}, g_copies_known{0}, g_known_bytes{0};

void take_contents(const trace::TensorDesc& from, trace::TensorDesc* desc) {
  constexpr uint8_t kContents = trace::kTensorHasStats | trace::kTensorHasNanInf |
                                trace::kTensorIntStats;
  desc->digest = from.digest;
  desc->digest_len = from.digest_len;
  desc->stats = from.stats;
  desc->bits = uint8_t((desc->bits & ~kContents) | (from.bits & kContents));
}

}  // namespace

bool ThreadRecorder::describe_from_arguments(const Frame& f, const at::Tensor& t,
                                             trace::TensorDesc* desc,
                                             std::shared_ptr<const PendingDigest>* pending) {
  const trace::TensorDesc* from = nullptr;
  if (f.copy_source_snap >= 0) {
    const Snapshot& read = snaps_[size_t(f.copy_source_snap)];
    from = &read.desc;
    *pending = read.pending;
  } else if (f.fill_size) {
    from = fills_.find(dtype_of(t), f.fill_element, f.fill_size, uint64_t(t.numel()));
    pending->reset();
  }
  if (!from) return false;
  (f.copy_source_snap >= 0 ? g_copies_known : g_fills_known)
      .fetch_add(1, std::memory_order_relaxed);
  g_known_bytes.fetch_add(uint64_t(t.nbytes()), std::memory_order_relaxed);
  describe_geometry(t, hasher_->length(), desc);
  take_contents(*from, desc);
#ifdef DETAUDIT_CHECKS
  // Sampled, so that the tests' builds still see the time it saves: the bytes agree.
  if (++known_outputs_ % 16 == 1 && !*pending) {
    trace::TensorDesc read;
    describe_tensor(t, hasher_.get(), ProcessRecorder::instance().config().stats, &read);
    DETAUDIT_DCHECK(read.same_digest(*desc),
                    "an output described from its op's arguments holds the bytes it names");
  }
#endif
  return true;
}

std::string host_known_outputs_status() {
  const uint64_t fills = g_fills_known.load(), copies = g_copies_known.load();
  if (fills + copies == 0) return "";
  return "outputs known from their arguments, not read: " + std::to_string(fills) + " fills, " +
         std::to_string(copies) + " copies, " + std::to_string(g_known_bytes.load()) + " bytes";
}

void forget_host_known_outputs_status() {
  for (auto* counter : {&g_fills_known, &g_copies_known, &g_known_bytes}) counter->store(0);
}

void ThreadRecorder::remember_fill(const Frame& f, const trace::TensorDesc& desc) {
  if (f.fill_size && desc.has_contents() && desc.digest_len != 0)
    fills_.remember(desc.dtype, f.fill_element, f.fill_size, desc.numel(), desc);
}

bool ThreadRecorder::recording_wanted(const OpInfo& info, trace::Phase* phase) {
  if (!info.recorded() || phases_.taking_in_batches()) return false;
  if (!identity_) identity_ = thread_identity();
  if (identity_->moves_batches) return false;
  ProcessRecorder& proc = ProcessRecorder::instance();
  *phase = phases_.phase(proc.is_python());
  return proc.config().select.wants_phase(*phase);
}

bool ThreadRecorder::sentinel_step(const ProcessRecorder& proc) const {
  return proc.watched_step(proc.step());
}

bool ThreadRecorder::sentinel_wants(Frame& f, trace::Phase phase) const {
  // Collectives stay: they tell data-parallel replicas (the replica check) from independent
  // processes, and a rank that differs from them.
  if (f.info->collective.defined()) return true;
  if (f.depth != 0) return false;
  // Begun only at its end, if it returned a loss: a forward op per time step (an LSTM's cells)
  // costs no more than an op not recorded.
  f.loss_candidate = phase == trace::Phase::kForward;
  return phase == trace::Phase::kOptimizer;
}

const OpInfo& ThreadRecorder::record_info(const std::string& name) {
  auto it = ops_.find(name);
  if (it == ops_.end()) {
    const bool selected = ProcessRecorder::instance().config().select.wants_op(name);
    it = ops_.emplace(name, describe_op(name.c_str(), OptionalOperatorName(), selected)).first;
    it->second.name_id = UINT32_MAX;
  }
  if (it->second.name_id == UINT32_MAX) it->second.name_id = sink_.intern(name);
  return it->second;
}

void ThreadRecorder::open_step_state(const at::RecordFunction& mark) {
  ProcessRecorder& proc = ProcessRecorder::instance();
  if (!proc.step_selected() || !sentinel_step(proc) || proc.is_dataloader_worker() ||
      proc.may_be_a_replica())
    return;
  sentinel_.open_step(mark.name());
}

void ThreadRecorder::write_step_state(const at::RecordFunction& mark) {
  ProcessRecorder& proc = ProcessRecorder::instance();
  const OpInfo& info = record_info(sentinel_.step_mark());
  const SentinelSteps::Taken state = sentinel_.take_step(
      info.recorded() && proc.config().select.wants_phase(trace::Phase::kOptimizer));
  if (state.read.empty() && state.left.empty()) return;  // nothing stepped (no gradients yet)
  // MD5's batch and the device digest spread the tensors their own way.
  if (!md5_batch_ && !device_digest_ &&
      sentinel_.describe_ahead(state, torch_pool_threads(), hasher_->algo(), proc.config().stats))
    proc.count_spread_step_state();
  Frame f = mark_record_frame(info, /*depth=*/0);
  const std::vector<c10::IValue> inputs{c10::IValue(state.read)};
  begin_op(mark, f, trace::Phase::kOptimizer, &inputs);
  if (f.recorded && !state.labelled_scope.empty()) f.scope_id = sink_.intern(state.labelled_scope);
  write_mark_record(f, {c10::IValue(state.left)});
  sentinel_.forget_described();
}

namespace {

// DETAUDIT_KNOWN_OUTPUTS=off: every output read, for the GPU check that the bits are the same.
bool known_outputs_wanted() {
  static const bool on = [] {
    const char* v = std::getenv("DETAUDIT_KNOWN_OUTPUTS");
    return !(v && std::string(v) == "off");
  }();
  return on;
}

// What a loss looks like: one floating scalar that autograd will differentiate.
bool looks_like_loss(const at::Tensor& t) {
  return t.defined() && t.dim() == 0 && t.is_floating_point() && t.requires_grad();
}
bool looks_like_loss(const std::vector<c10::IValue>& outputs) {
  return outputs.size() == 1 && outputs[0].isTensor() && looks_like_loss(outputs[0].toTensor());
}

}  // namespace

void ThreadRecorder::launch_device_batches_before(const at::RecordFunction& fn,
                                                  const OpInfo& info) {
  if (!any_device_batch_open()) return;
  if (info.collective.defined()) return launch_open_batches(Launch::kCollective);
  if (info.compiled_region) return launch_open_batches(Launch::kCompiled);
  if (!info.mutable_args) return;
  auto inputs = fn.inputs();
  // Without its arguments (an op whose callback had none), any batch might hold them.
  if (inputs.empty()) return launch_open_batches(Launch::kInPlace);
  for (size_t i = 0; i < inputs.size() && i < 64; ++i) {
    if (!(info.mutable_args & (uint64_t(1) << i))) continue;
    const c10::IValue& v = inputs[i];
    if (v.isTensor()) {
      launch_batches_holding(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList().vec()) launch_batches_holding(t);
    } else if (v.isList()) {  // Tensor?[]
      for (const c10::IValue& e : v.toListRef())
        if (e.isTensor()) launch_batches_holding(e.toTensor());
    }
  }
}

void ThreadRecorder::take_loss_from_mark(const at::RecordFunction& mark) {
  if (!ProcessRecorder::instance().config().sentinel) return;
  auto inputs = mark.inputs();
  if (inputs.empty() || !inputs[0].isTensor() || !looks_like_loss(inputs[0].toTensor())) return;
  ProcessRecorder& proc = ProcessRecorder::instance();
  proc.saw_backward_mark();
  const at::Tensor& loss = inputs[0].toTensor();
  const torch::autograd::Node* made_by = loss.grad_fn().get();
  const std::type_info* node = made_by ? &typeid(*made_by) : nullptr;
  if (!proc.loss_from_marks()) {
    // The op that made the loss was seen, and recorded (sentinel_wants): a lean step names its
    // loss after it, so that its trace reads as a sentinel's always did, while the autograd
    // node of its loss is of the same type (the same kind of op made it).
    sentinel_.backward_from(loss.unsafeGetTensorImpl(), node);
    return;
  }
  const OpInfo* maker = sentinel_.loss_maker(node);
  const bool same_maker = maker != nullptr;
  const OpInfo& info = same_maker ? *maker : record_info("detaudit::loss");
  trace::Phase phase;
  if (!recording_wanted(info, &phase)) return;
  // Ops ran unseen since the cache was right, and the loss may sit where a described tensor was.
  cache_.clear();
  Frame f = mark_record_frame(info, phases_.op_depth());
  f.loss_candidate = true;  // no inputs: the loss is its one output
  begin_op(mark, f, phase);
  if (same_maker)  // as the op's own record: a function's scope
    f.bits = uint8_t((f.bits & ~(3u << 2)) | (uint8_t(trace::Scope::kFunction) << 2));
  write_mark_record(f, {inputs[0]});
}

ThreadRecorder::Frame ThreadRecorder::mark_record_frame(const OpInfo& info, uint32_t depth) {
  Frame f;
  f.depth = depth;
  f.items_begin = f.items_end = items_.size();
  f.bytes_begin = bytes_.size();
  f.snaps_begin = snaps_top_;
  f.written_begin = f.written_end = written_.size();
  f.info = &info;
  return f;
}

void ThreadRecorder::write_mark_record(const Frame& f, const std::vector<c10::IValue>& outputs) {
  if (f.recorded) {
    if (f.plant >= 0) {
      Busy busy(&busy_);
      plant_at_end(f, outputs);
    }
    InBuffer in_buffer = sink_.enter();
    if (in_buffer.entered()) {
      Busy busy(&busy_);
      try {
        write_record(f, outputs);
      } catch (const std::exception& e) {
        report_swallowed(f.info->name.c_str(), e);
        holes_.clear();
      }
    }
  }
  items_.resize(f.items_begin);
  bytes_.resize(f.bytes_begin);
  bytes_item_start_ = bytes_.size();
  snaps_top_ = f.snaps_begin;
}

void ThreadRecorder::begin_op(const at::RecordFunction& fn, Frame& f, trace::Phase phase,
                              const std::vector<c10::IValue>* given_inputs) {
  ProcessRecorder& proc = ProcessRecorder::instance();
  const OpInfo& info = *f.info;
  f.recorded = true;
  f.order = proc.next_order();
  f.step = proc.step();
  if (f.step != step_started_.step) {
    step_started_ = {f.step, f.order};
    compiled_region_in_step_ = false;
  }
  if (info.compiled_region) compiled_region_in_step_ = true;
  f.name_id = info.name_id;
  // Interned only when a scope opened or closed: most ops share their neighbours' path.
  if (phases_.scope_changes() != scope_changes_seen_) {
    scope_id_ = sink_.intern(phases_.scope_path());
    scope_changes_seen_ = phases_.scope_changes();
  }
  f.scope_id = scope_id_;
  trace::Scope scope = fn.scope() == at::RecordScope::FUNCTION ? trace::Scope::kFunction
                       : fn.scope() == at::RecordScope::BACKWARD_FUNCTION
                           ? trace::Scope::kBackwardFunction
                           : trace::Scope::kOther;
  f.bits = uint8_t(uint8_t(phase) | (uint8_t(scope) << 2));
  if (info.compiled_region) f.bits |= trace::kOpCompiledRegion;
  f.seq_nr = fn.seqNr();
  if (f.seq_nr >= 0) f.bits |= trace::kOpHasSeqNr;
  f.grad_off = !c10::GradMode::is_enabled();
  if (f.depth == 0) cache_.set_top_level_serial(++top_level_serial_);

  bytes_item_start_ = bytes_.size();
  Busy busy(&busy_);  // to the end: saving the inputs below runs ops of its own too
  try {
    if (info.is_random) {
      f.bits |= trace::kOpIsRandom | trace::kOpHasRng;
      f.rng = rng_state(fn);
    }
    uint64_t overwritten = info.overwritten_args, written = info.written_args;
    // A lean sentinel step ran ops unseen before its optimizer window: what an op there writes is
    // described by what it becomes (its output), not hashed first (on a device, a launch each).
    if (proc.in_optimizer_window()) overwritten |= info.mutable_args;
    if (info.collective.defined()) {
      proc.saw_collective();
      f.collective = true;
      // A receive buffer is filled in full when the Work completes.
      overwritten = written = start_collective(fn, info, f.order);
    }
    if (info.layout_arg >= 0) {
      auto inputs = fn.inputs();
      f.constructor_empty = size_t(info.layout_arg) < inputs.size() &&
                            !inputs[size_t(info.layout_arg)].isNone();
    }
    if (info.returns_uninitialized && !f.constructor_empty) {
      const Frame* enclosing = nullptr;
      // A tensor subclass's handler (`PythonSubclass`) stands between the op and the empty
      // its __torch_dispatch__ runs.
      for (size_t k = depth_ - 1; k-- > 0 && !enclosing;)
        if (frames_[k].mark == Mark::kOp &&
            !(frames_[k].info && std::string_view(frames_[k].info->name) == "PythonSubclass"))
          enclosing = &frames_[k];
      f.program_empty = f.depth == 0 || (enclosing && enclosing->program_empty);
    }
    // A loss is begun at its end (sentinel_wants), when its inputs are gone.
    if (proc.config().inputs && !f.loss_candidate) {
      // Inside the buffer, so that small inputs can join the MD5 batch (md5_batch_).
      InBuffer in_buffer = sink_.enter(md5_batch_ != nullptr);
      c10::ArrayRef<const c10::IValue> inputs = given_inputs ? c10::ArrayRef<const c10::IValue>(
                                                                   given_inputs->data(),
                                                                   given_inputs->size())
                                                             : fn.inputs();
      ByteWriter(&bytes_).varint(inputs.size());
      for (size_t i = 0; i < inputs.size(); ++i) {
        const uint64_t bit = i < 64 ? uint64_t(1) << i : 0;
        capture_value(inputs[i], (written & bit)       ? Use::kWrittenInFull
                                 : (overwritten & bit) ? Use::kNotRead
                                                       : Use::kRead);
      }
    } else {
      ByteWriter(&bytes_).varint(0);
    }
    flush_bytes_item();
    f.items_end = items_.size();
    if (info.known_output != KnownOutput::kNone && known_outputs_wanted()) {
      if (device_digest_)
        know_output(fn, f);
      else
        know_output_on_host(fn, f);
    }
  } catch (const std::exception& e) {
    // Never throw into libtorch: an op we cannot describe goes unrecorded.
    report_swallowed(fn.name(), e);
    f.recorded = false;
  }
  // With record.device_batch_mib 0, the inputs' digests go on the stream now, ahead of the op's
  // own kernels; else they wait in the open batch for a launch (launch_device_batches_before).
  if (device_digest_ && device_batch_cap() == 0) device_batch_.launch(Launch::kOp);
  if (saw_fake_tensor_) f.recorded = false;  // torch.compile tracing, not the program's work
  saw_fake_tensor_ = false;
  // Still busy: saving the inputs runs ops of its own.
  if (CaptureSpec* spec = capture_spec(); spec && f.recorded && !capture_done(*spec))
    maybe_capture(*spec, fn, f, given_inputs == nullptr && !f.loss_candidate);
  if (!f.recorded) {
    items_.resize(f.items_begin);
    bytes_.resize(f.bytes_begin);
    snaps_top_ = f.snaps_begin;
  }
}

void ThreadRecorder::maybe_capture(CaptureSpec& spec, const at::RecordFunction& fn, Frame& f,
                                   bool op_arguments) {
  auto targets = spec.by_op.find(f.info->name);
  if (targets == spec.by_op.end()) return;
  const uint64_t seen = capture_seen_[f.info->name]++;
  std::optional<std::vector<std::string>> digests;  // worked out once, for the first match
  for (size_t k : targets->second) {
    const CaptureTarget& t = spec.targets[k];
    if (t.occurrence != seen || t.thread != identity_->name ||
        spec.done[k].load(std::memory_order_relaxed) ||
        ProcessRecorder::instance().process_name() != t.process)
      continue;
    if (t.plant) {
      if (t.plant_input || spec.done[k].exchange(true)) continue;
      spec.left.fetch_sub(1, std::memory_order_relaxed);
      f.plant = int(k);
      plant_watch_ = ArgumentWatch{};
      try {
        if (op_arguments) plant_watch_ = watch_arguments(fn);
      } catch (const std::exception& e) {
        report_swallowed(fn.name(), e);  // its returns and declared writes are planted in still
      }
      continue;
    }
    if (!op_arguments) continue;  // a loss begun at its end, or a mark's record: no inputs
    if (!digests) digests = input_digests_now(f);
    capture_op(spec, k, fn, *digests, generator_of(fn));
  }
}

void ThreadRecorder::plant_at_end(const Frame& f, const std::vector<c10::IValue>& outputs) {
  CaptureSpec& spec = *capture_spec();
  std::vector<PlantValue> values;
  auto add = [&values](const c10::IValue& v, const std::string& name) {
    if (v.isTensor()) values.push_back({v.toTensor(), name});
    if (v.isTensorList()) {
      const std::vector<at::Tensor> list = v.toTensorList().vec();
      for (size_t e = 0; e < list.size(); ++e)
        values.push_back({list[e], fmt::format("{}[{}]", name, e)});
    }
  };
  for (size_t i = 0; i < outputs.size(); ++i) add(outputs[i], fmt::format("output {}", i));
  const std::vector<UnreturnedWrite>& writes = f.info->unreturned_writes;
  std::vector<size_t> nth(writes.size(), 0);
  for (size_t w = f.written_begin; w < f.written_end; ++w) {
    const UnreturnedWrite& arg = writes[written_[w].write];
    const size_t e = nth[written_[w].write]++;
    values.push_back({at::Tensor(written_[w].impl.lock()),
                      arg.list ? fmt::format("written argument {}[{}]", arg.name, e)
                               : "written argument " + arg.name});
  }
  try {
    for (PlantValue& v : changed_arguments(plant_watch_)) values.push_back(std::move(v));
  } catch (const std::exception& e) {
    report_swallowed(f.info->name.c_str(), e);  // never into libtorch; planted in the others
  }
  plant_watch_ = ArgumentWatch{};
  plant_change(spec, size_t(f.plant), f.step, values);
}

void ThreadRecorder::plant_in_step_state(c10::ArrayRef<const c10::IValue> inputs,
                                         uint64_t mutable_args) {
  CaptureSpec& spec = *capture_spec();
  if (capture_done(spec)) return;
  const std::string& name = sentinel_.step_mark();
  auto targets = spec.by_op.find(name);
  if (targets == spec.by_op.end()) return;
  std::vector<PlantValue> values;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i < 64 && (mutable_args >> i & 1)) continue;  // what the step writes is its output
    if (inputs[i].isTensor())
      values.push_back({inputs[i].toTensor(), fmt::format("argument {}", i)});
    if (inputs[i].isTensorList()) {
      const std::vector<at::Tensor> list = inputs[i].toTensorList().vec();
      for (size_t e = 0; e < list.size(); ++e)
        values.push_back({list[e], fmt::format("argument {}[{}]", i, e)});
    }
  }
  // A gradient, not a hyperparameter's scalar (momentum as a tensor): the next op may read one.
  values.erase(std::remove_if(values.begin(), values.end(),
                              [](const PlantValue& v) {
                                return !v.tensor.defined() || v.tensor.numel() <= 1 ||
                                       !v.tensor.is_floating_point();
                              }),
               values.end());
  if (values.empty()) return;
  const uint64_t next = capture_seen_[name];  // this step's record, counted when it is begun
  for (size_t k : targets->second) {
    const CaptureTarget& t = spec.targets[k];
    if (!t.plant_input || t.occurrence != next || t.thread != identity_->name ||
        ProcessRecorder::instance().process_name() != t.process || spec.done[k].exchange(true))
      continue;
    spec.left.fetch_sub(1, std::memory_order_relaxed);
    Busy busy(&busy_);
    plant_change(spec, k, ProcessRecorder::instance().step(), values);
  }
}

std::vector<std::string> ThreadRecorder::input_digests_now(const Frame& f) {
  std::vector<std::string> digests;
  for (size_t i = f.items_begin; i < f.items_end; ++i) {
    if (!items_[i].is_tensor) continue;
    const Snapshot& s = snaps_[items_[i].begin];
    trace::TensorDesc desc = s.desc;
    if (s.pending) {
      // A capture run may wait for the device: the digest decides whether this is the op.
      if (!s.pending->done() && md5_batch_) {
        InBuffer in_buffer = sink_.enter();
        if (in_buffer.entered()) md5_batch_->run();
      }
      if (!s.pending->done()) {
        launch_open_batches(Launch::kCapture);
        drain_device_digests();
      }
      s.pending->apply(&desc);
    }
    digests.push_back(desc.not_read() ? std::string() : desc.digest_hex());
  }
  return digests;
}

void ThreadRecorder::take_written_args(const at::RecordFunction& fn, Frame& f) {
  auto inputs = fn.inputs();
  const std::vector<UnreturnedWrite>& writes = f.info->unreturned_writes;
  auto take = [&](const at::Tensor& t, size_t k) {
    WrittenTensor& w = written_.emplace_back();
    if (t.defined()) w.impl = TensorCache::WeakImpl(t.getIntrusivePtr());
    w.write = uint8_t(k);
  };
  for (size_t k = 0; k < writes.size(); ++k) {
    if (writes[k].index >= inputs.size()) continue;
    const c10::IValue& v = inputs[writes[k].index];
    if (v.isTensor()) {
      take(v.toTensor(), k);
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList().vec()) take(t, k);
    } else if (v.isList()) {  // Tensor?[]
      for (const c10::IValue& e : v.toListRef())
        take(e.isTensor() ? e.toTensor() : at::Tensor(), k);
    }
  }
  f.written_end = written_.size();
}

void ThreadRecorder::emit_written_args(const Frame& f, ByteWriter& w) {
  const std::vector<UnreturnedWrite>& writes = f.info->unreturned_writes;
  w.varint(writes.size());
  size_t next = f.written_begin;
  for (size_t k = 0; k < writes.size(); ++k) {
    w.varint(sink_.intern(writes[k].name));
    size_t end = next;
    while (end < f.written_end && written_[end].write == k) ++end;
    if (writes[k].list) {
      w.u8(uint8_t(ValueType::kList));
      w.varint(end - next);
    } else if (end == next) {
      w.u8(uint8_t(ValueType::kNone));  // an optional tensor not given
    }
    for (; next < end; ++next) emit_output(at::Tensor(written_[next].impl.lock()), w, f);
  }
}

void ThreadRecorder::forget_written_args(const Frame& f) {
  for (size_t k = f.written_begin; k < f.written_end; ++k)
    if (at::Tensor t(written_[k].impl.lock()); t.defined()) cache_.wrote_unseen(t);
}

void ThreadRecorder::write_record(const Frame& f, const std::vector<c10::IValue>& outputs) {
  ProcessRecorder& proc = ProcessRecorder::instance();
  if (!sink_.started()) open_stream();
  trace::RecordEncoder& encoder = sink_.encoder();
  if (f.step != last_written_.step) {
    trace::StepInfo info = proc.step_info();
    info.step = f.step;
    info.order = f.step == step_started_.step ? step_started_.first_order : f.order;
    encoder.step(info, sink_.out());
    last_written_.step = f.step;
    phases_.new_step();
  }
  if (f.scope_id != last_written_.scope) {
    sink_.write_strings();  // the path's string precedes the SCOPE record that names it
    encoder.scope(f.scope_id, sink_.out());
    last_written_.scope = f.scope_id;
  }

  ByteWriter& w = encoder.begin_op(
      {f.order, last_written_.order, f.name_id, f.bits, f.depth, f.grad_off, f.seq_nr, f.rng});
  for (size_t i = f.items_begin; i < f.items_end; ++i) {
    const Item& item = items_[i];
    if (item.is_tensor)
      emit_tensor(snaps_[item.begin], w);
    else
      w.raw(bytes_.data() + item.begin, item.end - item.begin);
  }
  w.varint(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (f.collective || collectives_.returns_unfilled_buffer(outputs[i]))
      emit_pending_output(outputs[i], w);
    else
      emit_output(outputs[i], w, f, i < 64 && (f.info->scratch_outputs >> i) & 1);
  }
  if (!f.info->unreturned_writes.empty()) emit_written_args(f, w);

  sink_.finish_record(&holes_);
  last_written_.order = f.order;
  ++sink_.totals().ops;
  sink_.release_held();
  sink_.commit();
  if (f.collective && collectives_.starting()) {
    // Its buffers change when the Work completes, unseen: what the cache says of them is void.
    for (const at::Tensor& t : collectives_.starting()->received) cache_.wrote_unseen(t);
    const Config& config = proc.config();
    collectives_.returned(outputs, config.digest, config.stats);
  }
  sink_.after_record();
}

std::string ThreadRecorder::open_op(uint64_t* step) const {
  for (size_t i = std::min(depth_, frames_.size()); i-- > 0;) {
    const Frame& f = frames_[i];
    if (f.mark == Mark::kOp && f.recorded && f.info) {
      *step = f.step;
      return f.info->name;
    }
  }
  return "";
}

void ThreadRecorder::close_for_signal(int sig, bool exiting, bool stopped) {
  uint64_t step = 0;
  sink_.close_for_signal(sig, exiting, stopped, stopped ? open_op(&step) : std::string());
}

void ThreadRecorder::on_end(const at::RecordFunction& fn) {
  if (busy_ || depth_ == 0) return;
  // Pop to the matching frame; RecordFunctions end in LIFO order on a thread.
  size_t i = depth_;
  while (i > 0 && frames_[i - 1].handle != fn.handle()) --i;
  if (i == 0) return;
  Frame& f = frames_[i - 1];
  depth_ = i - 1;

  if (f.mark != Mark::kOp) {
    ProcessRecorder& proc = ProcessRecorder::instance();
    const bool step_ends = phases_.leave(f.mark);
    // Closed first: with the op callback off, the step ends at once.
    if (is_optimizer_mark(f.mark) && phases_.outside_optimizer()) {
      if (sentinel_.step_open()) write_step_state(fn);
      proc.close_optimizer_window();
    }
    if (step_ends) proc.mark_step_end();
    return;
  }
  phases_.leave_op(f.backward);
  if (f.in_step_state)
    for (const c10::IValue& v : fn.outputs()) sentinel_.note(v, /*leaves=*/true);
  if (f.loss_candidate && !f.info->is_random && looks_like_loss(fn.outputs())) {
    begin_op(fn, f, trace::Phase::kForward);
    if (f.recorded)
      sentinel_.recorded_loss(fn.outputs()[0].toTensor().unsafeGetTensorImpl(), f.info);
  } else if (f.recorded && f.depth == 0 && !f.info->is_random &&
             ProcessRecorder::instance().config().sentinel && looks_like_loss(fn.outputs())) {
    // A sentinel's step recorded in full names its loss too, so that the lean steps after it
    // read alike whichever steps were full (a resumed process's first one).
    sentinel_.recorded_loss(fn.outputs()[0].toTensor().unsafeGetTensorImpl(), f.info);
  }
  if (!f.recorded && f.info && f.info->writes && !f.info->metadata_only) {
    // A write we do not record still changes bytes the cache describes.
    for (const c10::IValue& v : fn.outputs())
      if (v.isTensor() && v.toTensor().defined()) cache_.wrote_unseen(v.toTensor());
    forget_written_args(f);
  }
  if (f.recorded && produced_fake_tensor(fn.outputs())) f.recorded = false;
  if (f.recorded && f.plant >= 0) {
    Busy busy(&busy_);
    plant_at_end(f, fn.outputs());
  }
  // The only place this thread changes its stream buffer while the process runs: a stop
  // signal's save waits until no thread is here, then saves every buffer.
  if (f.recorded) {
    InBuffer in_buffer = sink_.enter();
    if (in_buffer.entered()) {
      Busy busy(&busy_);
      try {
        write_record(f, fn.outputs());
      } catch (const std::exception& e) {
        // Never throw into libtorch. The record was being encoded apart, and is dropped; what
        // the buffer holds is whole records.
        report_swallowed(fn.name(), e);
        holes_.clear();
      }
    }
  }
  if (device_digest_ && !device_batch_.empty()) {
    if (device_batch_cap() == 0)
      device_batch_.launch(Launch::kOp);
    else if (enclosing_kernel_may_write_batch(i - 1))
      device_batch_.launch(Launch::kEnclosing);
  }
  if (f.collective) collectives_.cancel();  // not recorded after all
  // A compiled region's kernels may have written any tensor, unseen (a C++ program's, torch 1.x,
  // record.compiled_kernels off, an extern fallback): nothing described before it is trusted.
  if (f.info && f.info->compiled_region) cache_.clear();
  written_.resize(f.written_begin);
  items_.resize(f.items_begin);
  bytes_.resize(f.bytes_begin);
  bytes_item_start_ = bytes_.size();
  snaps_top_ = f.snaps_begin;
}

}  // namespace detaudit::hooks
