#include "recorder.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "environment.h"
#include "run_layout.h"
#include "tensor_digest.h"

namespace detaudit::hooks {

using trace::ByteWriter;
using trace::Phase;
using trace::ValueType;

namespace {

constexpr size_t kHandoverBytes = 256 * 1024;
constexpr uint64_t kHandoverNs = 50'000'000;  // bounds what a kill -9 can lose
constexpr size_t kMaxCacheEntries = 1 << 16;  // swept when full: larger sweeps, fewer of them

uint64_t now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

// With DETAUDIT_DEBUG set, says once per op why it could not be recorded.
void report_swallowed(const char* op, const char* what) {
  static const bool debug = std::getenv("DETAUDIT_DEBUG") != nullptr;
  thread_local std::unordered_map<std::string, bool> seen;
  if (debug && !seen[op]) {
    seen[op] = true;
    std::fprintf(stderr, "detaudit: debug: %s not recorded: %s\n", op, what);
  }
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// In-place ops that change a tensor's sizes or strides, never its bytes: like views, not
// recorded (the cache checks shape and strides, so they cannot leave a stale description).
bool is_metadata_only(std::string_view name) {
  return name == "aten::as_strided_" || name == "aten::detach_" || name == "aten::squeeze_" ||
         name == "detach" || name == "detach_" ||  // autograd's schema-less kernels
         name == "aten::unsqueeze_" || name == "aten::transpose_" || name == "aten::t_" ||
         name == "aten::swapdims_" || name == "aten::swapaxes_";
}

// Outputs that are a kernel's scratch space, partly written (bit i: output i). oneDNN's LSTM
// leaves most of its workspace as it found it; cuDNN's and MIOpen's reserve is alike.
uint64_t scratch_outputs(std::string_view name) {
  if (name == "aten::mkldnn_rnn_layer" || name == "aten::_cudnn_rnn" || name == "aten::miopen_rnn")
    return uint64_t(1) << 3;
  return 0;
}

// torch.compile's regions: the dynamo frame, and the AOT autograd function forward and backward.
// Inductor's kernels inside them run below the dispatcher; only extern kernels (mm, conv) show.
bool is_compiled_region(std::string_view name) {
  return starts_with(name, "Torch-Compiled Region") || name == "CompiledFunction" ||
         name == "CompiledFunctionBackward";
}

// The cached description still matches the tensor's view of its storage.
bool same_geometry(const trace::TensorDesc& d, int64_t offset, const at::Tensor& t) {
  if (offset != t.storage_offset()) return false;
  auto sizes = t.sizes();
  if (d.sizes.size() != sizes.size() || !std::equal(sizes.begin(), sizes.end(), d.sizes.begin()))
    return false;
  if (d.bits & trace::kTensorContiguous) return t.is_contiguous();
  auto strides = t.strides();
  return std::equal(strides.begin(), strides.end(), d.strides.begin(), d.strides.end());
}

// In-place ops that never read self's bytes: they write every element, or only resize.
bool overwrites_self(std::string_view name) {
  static const char* kOps[] = {"aten::zero_",    "aten::fill_",       "aten::copy_",
                               "aten::normal_",  "aten::uniform_",    "aten::bernoulli_",
                               "aten::random_",  "aten::exponential_", "aten::geometric_",
                               "aten::log_normal_", "aten::cauchy_", "aten::resize_",
                               "aten::resize_as_", "aten::set_"};
  for (const char* op : kOps)
    if (name == op) return true;
  return false;
}

// Ops whose output holds bytes that no op wrote: the empty family, and resize_, which kernels
// call on their out= buffers (growing one leaves garbage; the kernel then writes it unseen).
bool returns_uninitialized(std::string_view name) {
  return name == "aten::empty" || name == "aten::empty_like" || name == "aten::empty_strided" ||
         name == "aten::new_empty" || name == "aten::new_empty_strided" ||
         name == "aten::empty_permuted" || name == "aten::resize_" || name == "aten::resize_as_";
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

uint32_t tensor_version(const at::Tensor& t) {
  const auto& vc = t.unsafeGetTensorImpl()->version_counter();
  return vc.enabled() ? vc.current_version() : 0;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ProcessRecorder

ProcessRecorder& ProcessRecorder::instance() {
  static ProcessRecorder* p = new ProcessRecorder();  // outlives static destruction
  return *p;
}

bool ProcessRecorder::init(const std::string& run_dir, const Config& config, std::string* error) {
  config_ = config;
  streams_dir_ = run_dir + "/" + layout::kStreamsDir;
  ::mkdir(run_dir.c_str(), 0755);
  if (::mkdir(streams_dir_.c_str(), 0755) != 0 && errno != EEXIST) {
    *error = "cannot create " + streams_dir_ + ": " + std::strerror(errno);
    return false;
  }
  for (const char* var : {"RANK", "LOCAL_RANK"}) {
    if (const char* v = std::getenv(var)) {
      rank_ = std::strtol(v, nullptr, 10);
      break;
    }
  }
  is_python_ = python_is_host();
  if (!config_.select.ranks.contains(uint64_t(rank_))) return false;
  refresh_step_state(0);
  active_ = true;
  return true;
}

void ProcessRecorder::refresh_step_state(uint64_t step) {
  const bool selected = config_.select.steps.contains(step);
  step_selected_.store(selected, std::memory_order_relaxed);
  step_rng_.store(default_rng_digest(), std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(op_callback_mu_);
  if (op_callback_ == 0 || selected == op_callback_on_.load()) return;
  if (selected) {
    op_callback_epoch_.fetch_add(1, std::memory_order_release);
    at::reenableCallback(op_callback_);
    at::disableCallback(marks_callback_);
  } else {
    at::reenableCallback(marks_callback_);
    at::disableCallback(op_callback_);
  }
  op_callback_on_.store(selected);
}

void ProcessRecorder::set_callbacks(at::CallbackHandle ops, at::CallbackHandle marks) {
  {
    std::lock_guard<std::mutex> lock(op_callback_mu_);
    op_callback_ = ops;
    marks_callback_ = marks;
    at::disableCallback(marks_callback_);  // registered enabled: now the op callback alone
    op_callback_on_.store(true);
  }
  refresh_step_state(step());
}

void ProcessRecorder::mark_step_end() {
  // With the op callback off no op is being recorded, so none can straddle the boundary.
  if (op_callback_ != 0 && !op_callback_on_.load())
    advance_step();
  else
    step_pending_.store(true, std::memory_order_relaxed);
}

void ProcessRecorder::advance_step() {
  uint64_t s = step_.fetch_add(1, std::memory_order_relaxed) + 1;
  refresh_step_state(s);
}

void ProcessRecorder::maybe_advance_step() {
  if (!step_pending_.load(std::memory_order_relaxed)) return;
  if (!step_pending_.exchange(false)) return;
  advance_step();
}

trace::StepInfo ProcessRecorder::step_info() const {
  trace::StepInfo info;
  info.step = step();
  info.rng_cpu = step_rng_.load(std::memory_order_relaxed);
  info.intra_op_threads = uint64_t(at::get_num_threads());
  info.determinism_bits = determinism_bits();
  return info;
}

void ProcessRecorder::register_thread(ThreadRecorder* t) {
  std::lock_guard<std::mutex> lock(threads_mu_);
  threads_.push_back(t);
}

void ProcessRecorder::unregister_thread(ThreadRecorder* t) {
  std::lock_guard<std::mutex> lock(threads_mu_);
  for (auto& p : threads_)
    if (p == t) p = nullptr;
}

void ProcessRecorder::finish_all() {
  {
    std::lock_guard<std::mutex> lock(threads_mu_);
    for (ThreadRecorder* t : threads_)
      if (t) t->finish();
  }
  StreamWriter::instance().drain();
}

void ProcessRecorder::write_environment_once() {
  if (env_written_.exchange(true)) return;
  write_environment(streams_dir_ + "/" + layout::process_name(rank_, role_) + layout::kEnvExt,
                    *this);
}

void ProcessRecorder::after_fork_child() {
  role_ += "." + std::to_string(forks_ - 1);
  fork_generation_.fetch_add(1);
  forks_ = 0;
  order_.store(0);
  next_thread_.store(0);
  env_written_.store(false);
  new (&threads_mu_) std::mutex();  // another thread may have held it at fork time
  threads_.clear();
  StreamWriter::instance().reset_after_fork();
}

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

ThreadRecorder* ThreadRecorder::current() {
  if (tls_recorder) return tls_recorder;
  if (tls_destroyed) return nullptr;  // thread exit: ops after our destructor go unrecorded
  tls_holder.recorder.reset(new ThreadRecorder());
  tls_recorder = tls_holder.recorder.get();
  return tls_recorder;
}

ThreadRecorder::ThreadRecorder()
    : fork_generation_(ProcessRecorder::instance().fork_generation()) {
  hasher_ = std::make_unique<Hasher>(ProcessRecorder::instance().config().digest);
  rehash_inputs_ = ProcessRecorder::instance().config().rehash_inputs;
  frames_.resize(64);
  ProcessRecorder::instance().register_thread(this);
}

ThreadRecorder::~ThreadRecorder() {
  ProcessRecorder::instance().unregister_thread(this);
  if (fork_generation_ == ProcessRecorder::instance().fork_generation()) finish();
}

void ThreadRecorder::finish() {
  if (!stream_open_) return;
  encoder_.end(totals_, &stream_.bytes);
  stream_.committed.store(stream_.bytes.size(), std::memory_order_release);
  StreamWriter::instance().hand_over(&stream_);
  stream_open_ = false;  // a later op on this thread would start a second stream file
}

void ThreadRecorder::reset_after_fork() {
  // Everything here describes the parent's stream: the child starts its own.
  fork_generation_ = ProcessRecorder::instance().fork_generation();
  stream_.fd = -1;
  stream_.bytes.clear();
  stream_.committed.store(0);
  stream_open_ = false;
  strings_.clear();
  pending_strings_.clear();
  for (auto& [name, info] : ops_) info.name_id = UINT32_MAX;
  clear_caches();
  next_tensor_id_ = 0;
  last_step_written_ = UINT64_MAX;
  last_order_written_ = 0;
  totals_ = {};
  ProcessRecorder::instance().register_thread(this);
}

void ThreadRecorder::open_stream() {
  ProcessRecorder& proc = ProcessRecorder::instance();
  thread_index_ = proc.new_thread_index();
  std::string path = proc.streams_dir() + "/" +
                     layout::stream_name(proc.rank(), proc.role(), thread_index_) +
                     layout::kTraceExt;
  // O_EXCL: two processes that both call themselves rank 0 "main" must not share a file.
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  for (int k = 1; fd < 0 && errno == EEXIST && k < 1000; ++k) {
    std::string alt = proc.streams_dir() + "/" +
                      layout::stream_name(proc.rank(), proc.role() + "~" + std::to_string(k),
                                          thread_index_) +
                      layout::kTraceExt;
    fd = ::open(alt.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  }
  stream_.fd = fd;
  stream_open_ = true;
  trace::StreamHeader h;
  h.algo = proc.config().digest;
  h.rank = proc.rank();
  h.pid = uint64_t(::getpid());
  h.process_role = proc.role();
  h.thread_index = thread_index_;
  h.unix_ns = uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count());
  encoder_.header(h, &stream_.bytes);
  stream_.committed.store(stream_.bytes.size(), std::memory_order_release);
  last_handover_ns_ = now_ns();
  proc.write_environment_once();
}

uint32_t ThreadRecorder::intern(std::string_view s) {
  auto it = strings_.find(std::string(s));
  if (it != strings_.end()) return it->second;
  uint32_t id = uint32_t(strings_.size());
  strings_.emplace(std::string(s), id);
  pending_strings_.emplace_back(s);
  return id;
}

const ThreadRecorder::OpInfo& ThreadRecorder::op_info(const at::RecordFunction& fn) {
  const char* name = fn.name();
  auto fast = ops_by_name_ptr_.find(name);
  // Other records name themselves with short-lived strings: a reused address must match too.
  if (fast != ops_by_name_ptr_.end() && std::strcmp(fast->second->name.c_str(), name) == 0) {
    OpInfo& info = *fast->second;
    if (info.name_id == UINT32_MAX) info.name_id = intern(name);
    return info;
  }
  auto op_name = fn.operator_name();
  std::string key = op_name ? op_name->name + "." + op_name->overload_name : std::string(name);
  auto it = ops_.find(key);
  if (it == ops_.end()) it = ops_.emplace(key, make_op_info(name, op_name)).first;
  if (it->second.name_id == UINT32_MAX) it->second.name_id = intern(name);
  ops_by_name_ptr_[name] = &it->second;
  return it->second;
}

ThreadRecorder::OpInfo ThreadRecorder::make_op_info(const char* name,
                                                    const OptionalOperatorName& op_name) {
  OpInfo info;
  info.name = name;
  info.name_id = intern(name);
  info.selected = ProcessRecorder::instance().config().select.wants_op(name);
  info.returns_uninitialized = returns_uninitialized(name);
  info.metadata_only = is_metadata_only(name);
  info.compiled_region = is_compiled_region(name);
  info.repoints_storage = std::string_view(name) == "aten::set_";
  info.scratch_outputs = scratch_outputs(name);
  if (op_name) {
    if (auto handle = c10::Dispatcher::singleton().findOp(*op_name)) {
      info.composite = handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) ||
                       handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd);
      const c10::FunctionSchema& schema = handle->schema();
      // A view returns an alias it does not write: not recorded, its data is its base's.
      for (const auto& ret : schema.returns()) {
        const auto* alias = ret.alias_info();
        if (alias && !alias->isWrite()) info.is_view = true;
      }
      const auto& args = schema.arguments();
      for (size_t i = 0; i < args.size(); ++i) {
        const c10::Argument& arg = args[i];
        if (arg.alias_info() && arg.alias_info()->isWrite()) {
          info.writes = true;
          if (i < 64 && (arg.is_out() || (arg.name() == "self" && overwrites_self(name))))
            info.overwritten_args |= uint64_t(1) << i;
        }
        c10::TypePtr type = arg.type();
        if (type->kind() == c10::TypeKind::OptionalType)
          type = type->containedType(0);
        if (type->kind() == c10::TypeKind::GeneratorType) info.is_random = true;
      }
    }
  }
  return info;
}

Phase ThreadRecorder::current_phase() const {
  if (backward_depth_ > 0) return Phase::kBackward;
  const bool grad = c10::GradMode::is_enabled();
  // Inside Optimizer.step, grad-enabled work is a closure's forward pass (LBFGS).
  if (optimizer_step_depth_ > 0 && optimizer_step_depth_ == optimizer_depth_)
    return grad ? Phase::kForward : Phase::kOptimizer;
  if (optimizer_depth_ > 0) return Phase::kOptimizer;  // zero_grad and the like
  // C++ programs have no optimizer marks: no-grad work after a backward is the optimizer's.
  if (!ProcessRecorder::instance().is_python() && backward_seen_in_step_ && !grad)
    return Phase::kOptimizer;
  return Phase::kForward;
}

uint64_t ThreadRecorder::rng_state(const at::RecordFunction& fn) {
  for (const c10::IValue& v : fn.inputs())
    if (v.isGenerator()) return generator_digest(v.toGenerator());
  return default_rng_digest();
}

void ThreadRecorder::on_start(const at::RecordFunction& fn) {
  if (busy_) return;
  if (fork_generation_ != ProcessRecorder::instance().fork_generation()) reset_after_fork();
  ProcessRecorder& proc = ProcessRecorder::instance();

  if (depth_ == frames_.size()) frames_.resize(frames_.size() * 2);
  Frame& f = frames_[depth_];
  f = Frame{};
  f.handle = fn.handle();
  f.depth = uint32_t(op_depth_);
  f.items_begin = f.items_end = items_.size();
  f.bytes_begin = bytes_.size();
  f.snaps_begin = snaps_top_;
  ++depth_;

  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    std::string_view name = fn.name();
    if (starts_with(name, "Optimizer.step#")) {
      f.marker = Marker::kOptimizerStep;
    } else if (starts_with(name, "Optimizer.") || name == "detaudit::optimizer") {
      f.marker = Marker::kOptimizerOther;
    } else if (name == "detaudit::step") {
      f.marker = Marker::kStep;
    }
    // Back-to-back step() calls (LBFGS in torch 2.x runs no op between them) still start a step.
    if (f.marker == Marker::kOptimizerStep && optimizer_depth_ == 0 && backward_depth_ == 0)
      proc.maybe_advance_step();
    if (f.marker == Marker::kOptimizerStep) ++optimizer_step_depth_;
    if (f.marker == Marker::kOptimizerStep || f.marker == Marker::kOptimizerOther)
      ++optimizer_depth_;
    return;
  }
  if (starts_with(fn.name(), "autograd::engine::evaluate_function")) {
    // The engine's wrapper around each node: backward phase, nothing of its own to record.
    f.marker = Marker::kBackwardNode;
    ++backward_depth_;
    return;
  }

  ++op_depth_;
  if (backward_depth_ == 0 && optimizer_depth_ == 0) proc.maybe_advance_step();
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    f.backward = true;
    ++backward_depth_;
  }
  if (!proc.step_selected()) {
    unselected_since_clear_ = true;  // writes we do not see: start afresh when recording resumes
    return;
  }
  if (unselected_since_clear_ || op_callback_epoch_ != proc.op_callback_epoch()) {
    clear_caches();
    unselected_since_clear_ = false;
    op_callback_epoch_ = proc.op_callback_epoch();
  }
  const OpInfo& info = op_info(fn);
  f.info = &info;
  if (info.is_view || info.metadata_only || !info.selected) return;
  const Phase phase = current_phase();
  if (!proc.config().select.wants_phase(phase)) return;

  f.recorded = true;
  f.order = proc.next_order();
  f.step = proc.step();
  if (f.step != step_started_) {
    step_started_ = f.step;
    step_first_order_ = f.order;
    compiled_region_in_step_ = false;
  }
  if (info.compiled_region) compiled_region_in_step_ = true;
  f.name_id = info.name_id;
  trace::Scope scope = fn.scope() == at::RecordScope::FUNCTION            ? trace::Scope::kFunction
                       : fn.scope() == at::RecordScope::BACKWARD_FUNCTION ? trace::Scope::kBackwardFunction
                                                                           : trace::Scope::kOther;
  f.bits = uint8_t(uint8_t(phase) | (uint8_t(scope) << 2));
  if (info.compiled_region) f.bits |= trace::kOpCompiledRegion;
  f.seq_nr = fn.seqNr();
  if (f.seq_nr >= 0) f.bits |= trace::kOpHasSeqNr;
  if (f.depth == 0) ++top_level_serial_;

  bytes_item_start_ = bytes_.size();
  busy_ = true;  // ops the recorder runs itself (generator state, device copies) are not the program's
  try {
    if (info.is_random) {
      f.bits |= trace::kOpIsRandom | trace::kOpHasRng;
      f.rng = rng_state(fn);
    }
    if (proc.config().inputs) {
      auto inputs = fn.inputs();
      ByteWriter(&bytes_).varint(inputs.size());
      for (size_t i = 0; i < inputs.size(); ++i)
        capture_value(inputs[i], /*overwritten=*/i < 64 && (info.overwritten_args >> i) & 1);
    } else {
      ByteWriter(&bytes_).varint(0);
    }
    flush_bytes_item();
    f.items_end = items_.size();
  } catch (const std::exception& e) {
    // Never throw into libtorch: an op we cannot describe goes unrecorded.
    report_swallowed(fn.name(), e.what());
    f.recorded = false;
  }
  if (saw_fake_tensor_) f.recorded = false;  // torch.compile tracing, not the program's work
  saw_fake_tensor_ = false;
  if (!f.recorded) {
    items_.resize(f.items_begin);
    bytes_.resize(f.bytes_begin);
    snaps_top_ = f.snaps_begin;
  }
  busy_ = false;
}

void ThreadRecorder::flush_bytes_item() {
  if (bytes_.size() > bytes_item_start_)
    items_.push_back(Item{false, uint32_t(bytes_item_start_), uint32_t(bytes_.size())});
  bytes_item_start_ = bytes_.size();
}

void ThreadRecorder::capture_value(const c10::IValue& v, bool overwritten) {
  ByteWriter w(&bytes_);
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      w.u8(uint8_t(ValueType::kNone));
    } else if (const char* why = unhashable_reason(t)) {
      saw_fake_tensor_ |= why == kNoDataReason;
      w.u8(uint8_t(ValueType::kTensorSkipped));
      w.varint(intern(why));
    } else {
      capture_tensor(t, overwritten);
    }
  } else if (v.isNone()) {
    w.u8(uint8_t(ValueType::kNone));
  } else if (v.isBool()) {
    w.u8(uint8_t(v.toBool() ? ValueType::kBoolTrue : ValueType::kBoolFalse));
  } else if (v.isInt()) {
    w.u8(uint8_t(ValueType::kInt));
    w.zvarint(v.toInt());
  } else if (v.isDouble()) {
    w.u8(uint8_t(ValueType::kDouble));
    w.f64(v.toDouble());
  } else if (v.isString()) {
    w.u8(uint8_t(ValueType::kString));
    w.varint(intern(v.toStringRef()));
  } else if (v.isIntList()) {
    auto list = v.toIntList();
    w.u8(uint8_t(ValueType::kIntList));
    w.varint(list.size());
    for (int64_t x : list) w.zvarint(x);
  } else if (v.isDoubleList()) {
    auto list = v.toDoubleList();
    w.u8(uint8_t(ValueType::kDoubleList));
    w.varint(list.size());
    for (double x : list) w.f64(x);
  } else if (v.isBoolList()) {
    auto list = v.toBoolList();
    w.u8(uint8_t(ValueType::kBoolList));
    w.varint(list.size());
    for (bool x : list) w.u8(x);
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    w.u8(uint8_t(ValueType::kList));
    w.varint(list.size());
    for (const at::Tensor& t : list) capture_value(t, overwritten);
  } else if (v.isList()) {
    auto list = v.toListRef();
    w.u8(uint8_t(ValueType::kList));
    w.varint(list.size());
    for (const c10::IValue& e : list) capture_value(e, overwritten);
  } else if (v.isTuple()) {
    const auto& elems = v.toTupleRef().elements();
    w.u8(uint8_t(ValueType::kList));
    w.varint(elems.size());
    for (const c10::IValue& e : elems) capture_value(e, overwritten);
  } else if (v.isDevice()) {
    w.u8(uint8_t(ValueType::kDevice));
    w.u8(uint8_t(v.toDevice().type()));
    w.zvarint(v.toDevice().index());
  } else if (v.isGenerator()) {
    w.u8(uint8_t(ValueType::kGenerator));
    w.u64(generator_digest(v.toGenerator()));
  } else {
    w.u8(uint8_t(ValueType::kOther));
    w.varint(intern(v.tagKind()));
  }
}

void ThreadRecorder::capture_tensor(const at::Tensor& t, bool overwritten) {
  flush_bytes_item();
  if (snaps_top_ == snaps_.size()) snaps_.resize(snaps_.size() * 2 + 8);
  Snapshot& s = snaps_[snaps_top_];
  items_.push_back(Item{true, uint32_t(snaps_top_), 0});
  ++snaps_top_;

  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  s.key = impl;
  s.cacheable = !impl->is_inference();
  s.version = tensor_version(t);
  s.base_id = -1;

  if (s.cacheable) {
    CacheEntry* e = lookup(t, s.version, /*allow_external=*/true);
    // Bytes an op reads after an `empty` were written by code outside the dispatcher
    // (torch.tensor(list), NumPy): hash them as found.
    if (e && !e->desc.uninitialized()) {
      s.desc = e->desc;
      s.base_id = e->base_id;
      s.storage_writes = e->storage_writes;
      return;
    }
  }
  // First sight of this TensorImpl at this version. Another TensorImpl over the same bytes
  // (autograd's saved tensors, detach()) reuses their description; otherwise hash.
  StorageEntry* st = storage_of(t);
  const bool same_bytes_known = st && st->id >= 0 && st->version == s.version &&
                                !(st->last && st->last->desc.uninitialized());
  // First seen after a compiled region ran: most likely its output, made by kernels we cannot see.
  trace::Provenance prov = same_bytes_known            ? trace::Provenance::kView
                           : compiled_region_in_step_ ? trace::Provenance::kCompiled
                                                      : trace::Provenance::kExternal;
  if (same_bytes_known) s.base_id = st->id;
  const trace::TensorDesc* known = nullptr;
  if (!rehash_inputs_ && same_bytes_known && st->last && st->last->storage == st &&
      st->last->storage_writes == st->writes &&
      same_geometry(st->last->desc, st->last->storage_offset, t))
    known = &st->last->desc;
  for (size_t i = 0; st && !rehash_inputs_ && !known && i < st->views.size(); ++i)
    if (st->views[i].writes == st->writes && same_geometry(st->views[i].desc, st->views[i].offset, t))
      known = &st->views[i].desc;
  if (known) {
    s.desc = *known;
  } else if (overwritten) {
    // Bytes the op never reads: their shape says enough. Not cached, so no later reader of this
    // version is told "not read".
    describe_geometry(t, hasher_->length(), &s.desc);
    s.desc.bits |= trace::kTensorNotRead;
    s.desc.set_provenance(prov);
    s.cacheable = false;
    return;
  } else {
    totals_.bytes_hashed += describe_tensor(t, hasher_.get(), ProcessRecorder::instance().config().stats, &s.desc);
    ++totals_.tensors_hashed;
    if (st) {
      StorageEntry::View& v = st->views[st->next_view++ % st->views.size()];
      v.writes = st->writes;
      v.offset = t.storage_offset();
      v.desc = s.desc;
    }
  }
  s.desc.set_provenance(prov);
  if (!s.cacheable) return;
  CacheEntry& e = remember(t, s.version, s.desc);
  e.external_serial = prov != trace::Provenance::kView ? top_level_serial_ : 0;
  e.storage = st;
  e.storage_writes = st ? st->writes : 0;
  e.base_id = s.base_id;
  s.storage_writes = e.storage_writes;
}

ThreadRecorder::CacheEntry& ThreadRecorder::remember(const at::Tensor& t, uint32_t version,
                                                     const trace::TensorDesc& desc) {
  make_room();
  CacheEntry& e = cache_[t.unsafeGetTensorImpl()];
  e = CacheEntry{};
  e.impl = WeakImpl(t.getIntrusivePtr());
  e.version = version;
  e.storage_offset = t.storage_offset();
  e.top_level_serial = top_level_serial_;
  e.desc = desc;
  return e;
}

ThreadRecorder::StorageEntry* ThreadRecorder::storage_of(const at::Tensor& t) {
  if (!t.has_storage()) return nullptr;
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  StorageEntry& st = storages_[impl];
  if (st.storage.expired()) {  // new, or a freed storage's address reused
    st = StorageEntry{};
    st.storage = t.storage().getWeakStorageImpl();
  }
  return &st;
}

ThreadRecorder::CacheEntry* ThreadRecorder::lookup(const at::Tensor& t, uint32_t version,
                                                   bool allow_external) {
  auto it = cache_.find(t.unsafeGetTensorImpl());
  if (it == cache_.end()) return nullptr;
  CacheEntry& e = it->second;
  if (e.impl.expired() || e.version != version || !same_geometry(e.desc, e.storage_offset, t))
    return nullptr;
  if (e.storage && e.storage->writes != e.storage_writes) return nullptr;
  if (e.external_serial != 0 && (!allow_external || e.external_serial != top_level_serial_))
    return nullptr;
  // Trusting no writer outside torch: what an earlier top-level op saw is not evidence.
  if (rehash_inputs_ && e.top_level_serial != top_level_serial_) return nullptr;
  return &e;
}

void ThreadRecorder::make_room() {
  if (cache_.size() < kMaxCacheEntries) return;
  // Forget what died; the rest stays valid. Order matters: pointers between the two maps
  // must never lead to an erased entry.
  auto dead = [](const CacheEntry& e) {
    return e.impl.expired() || (e.storage && e.storage->storage.expired());
  };
  for (auto& [impl, st] : storages_)
    if (st.last && dead(*st.last)) st.last = nullptr;
  for (auto it = cache_.begin(); it != cache_.end();) it = dead(it->second) ? cache_.erase(it) : std::next(it);
  for (auto it = storages_.begin(); it != storages_.end();)
    it = it->second.storage.expired() ? storages_.erase(it) : std::next(it);
  if (cache_.size() >= kMaxCacheEntries * 3 / 4) clear_caches();
}

void ThreadRecorder::clear_caches() {
  cache_.clear();
  storages_.clear();
}

void ThreadRecorder::emit_tensor(const Snapshot& s, ByteWriter& w) {
  if (s.cacheable) {
    auto it = cache_.find(s.key);
    // Still the version this op saw at its start? A nested in-place kernel may have written it
    // without a version bump, which shows as a storage write.
    if (it != cache_.end() && it->second.version == s.version && !it->second.impl.expired() &&
        it->second.storage_writes == s.storage_writes) {
      CacheEntry& e = it->second;
      if (e.id >= 0 && next_tensor_id_ - e.id <= int64_t(trace::kRefWindow)) {
        w.u8(uint8_t(ValueType::kTensorRef));
        w.varint(uint64_t(next_tensor_id_ - e.id));
        return;
      }
      e.id = next_tensor_id_;
    }
  }
  write_new(w, s.desc, s.base_id);
}

int64_t ThreadRecorder::write_new(ByteWriter& w, const trace::TensorDesc& desc, int64_t base_id) {
  const int64_t id = next_tensor_id_++;
  w.u8(uint8_t(ValueType::kTensorNew));
  if (desc.provenance() != trace::Provenance::kView) {
    trace::write_tensor(w, desc, 0);
  } else if (base_id >= 0 && base_id < id && id - base_id <= int64_t(trace::kRefWindow)) {
    trace::write_tensor(w, desc, uint64_t(id - base_id));
  } else {
    trace::TensorDesc external = desc;
    external.set_provenance(trace::Provenance::kExternal);
    trace::write_tensor(w, external, 0);
  }
  return id;
}

void ThreadRecorder::emit_output(const c10::IValue& v, ByteWriter& w, const Frame& f, bool scratch) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      w.u8(uint8_t(ValueType::kNone));
    } else if (const char* why = unhashable_reason(t)) {
      w.u8(uint8_t(ValueType::kTensorSkipped));
      w.varint(intern(why));
    } else {
      emit_output_tensor(t, w, f, scratch);
    }
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    w.u8(uint8_t(ValueType::kList));
    w.varint(list.size());
    for (const at::Tensor& t : list) emit_output(t, w, f);
  } else if (v.isTuple()) {
    const auto& elems = v.toTupleRef().elements();
    w.u8(uint8_t(ValueType::kList));
    w.varint(elems.size());
    for (const c10::IValue& e : elems) emit_output(e, w, f);
  } else if (v.isList()) {
    auto list = v.toListRef();
    w.u8(uint8_t(ValueType::kList));
    w.varint(list.size());
    for (const c10::IValue& e : list) emit_output(e, w, f);
  } else {
    // Scalars and other returns: encoded like inputs, through the input byte stack.
    size_t mark = bytes_.size();
    size_t item_mark = items_.size();
    size_t start = bytes_item_start_;
    bytes_item_start_ = mark;
    capture_value(v);
    w.raw(bytes_.data() + mark, bytes_.size() - mark);
    bytes_.resize(mark);
    items_.resize(item_mark);
    bytes_item_start_ = start;
  }
}

void ThreadRecorder::emit_output_tensor(const at::Tensor& t, ByteWriter& w, const Frame& f,
                                        bool scratch) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (f.info->repoints_storage) {
    // set_: the bytes are whatever the new storage holds (a DataLoader worker's batch, a fresh
    // allocation). They are compared where an op reads them; what the cache said is void.
    thread_local trace::TensorDesc desc;
    describe_geometry(t, hasher_->length(), &desc);
    desc.bits |= trace::kTensorNotRead;
    cache_.erase(impl);
    write_new(w, desc, -1);
    return;
  }
  const bool cacheable = !impl->is_inference();
  const uint32_t version = tensor_version(t);
  CacheEntry* e = cacheable ? lookup(t, version, /*allow_external=*/true) : nullptr;
  // A cached description stands for this output only if no kernel can have written it since:
  // never after an `empty`, never for a backend kernel (it writes raw memory), and for a
  // writing op only if a nested op described it after this op began.
  if (e && (e->desc.uninitialized() || !f.info->composite ||
            (f.info->writes && e->written_order < f.order)))
    e = nullptr;
  if (e && e->id >= 0 && next_tensor_id_ - e->id <= int64_t(trace::kRefWindow)) {
    w.u8(uint8_t(ValueType::kTensorRef));
    w.varint(uint64_t(next_tensor_id_ - e->id));
    return;
  }
  if (!e) {
    thread_local trace::TensorDesc desc;
    if (f.info->returns_uninitialized || scratch) {
      // Uninitialized bytes: their digest would differ run to run and mean nothing.
      describe_geometry(t, hasher_->length(), &desc);
      desc.bits |= trace::kTensorUninitialized;
    } else {
      totals_.bytes_hashed += describe_tensor(t, hasher_.get(), ProcessRecorder::instance().config().stats, &desc);
      ++totals_.tensors_hashed;
    }
    if (cacheable) {
      e = &remember(t, version, desc);
      e->written_order = f.order;
    } else {
      write_new(w, desc, -1);
      return;
    }
  }
  e->id = write_new(w, e->desc, e->base_id);
  // This op wrote a new version: retire what the cache holds for aliases of its storage.
  if (StorageEntry* st = storage_of(t)) {
    ++st->writes;
    st->version = version;
    st->id = e->id;
    st->last = e;
    e->storage = st;
    e->storage_writes = st->writes;
  }
}

void ThreadRecorder::emit_string_records() {
  for (const std::string& s : pending_strings_) string_encoder_.string(s, &stream_.bytes);
  pending_strings_.clear();
}

void ThreadRecorder::write_record(const Frame& f, const at::RecordFunction& fn) {
  ProcessRecorder& proc = ProcessRecorder::instance();
  if (!stream_open_) open_stream();
  if (f.step != last_step_written_) {
    trace::StepInfo info = proc.step_info();
    info.step = f.step;
    info.order = f.step == step_started_ ? step_first_order_ : f.order;
    encoder_.step(info, &stream_.bytes);
    last_step_written_ = f.step;
    backward_seen_in_step_ = false;
  }

  ByteWriter& w = encoder_.begin(trace::RecordKind::kOp);
  w.zvarint(int64_t(f.order - last_order_written_));
  w.varint(f.name_id);
  w.u8(f.bits);
  w.varint(f.depth);
  if (f.bits & trace::kOpHasSeqNr) w.zvarint(f.seq_nr);
  if (f.bits & trace::kOpHasRng) w.u64(f.rng);
  for (size_t i = f.items_begin; i < f.items_end; ++i) {
    const Item& item = items_[i];
    if (item.is_tensor)
      emit_tensor(snaps_[item.begin], w);
    else
      w.raw(bytes_.data() + item.begin, item.end - item.begin);
  }
  const auto& outputs = fn.outputs();
  w.varint(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i)
    emit_output(outputs[i], w, f, i < 64 && (f.info->scratch_outputs >> i) & 1);

  // Strings interned while encoding this op must precede it in the file.
  emit_string_records();
  encoder_.finish(&stream_.bytes);
  last_order_written_ = f.order;
  ++totals_.ops;
  stream_.committed.store(stream_.bytes.size(), std::memory_order_release);
  after_record();
}

void ThreadRecorder::after_record() {
  const bool big = stream_.bytes.size() >= kHandoverBytes;
  if (big || (++records_since_handover_ & 7) == 0) {
    uint64_t now = now_ns();
    if (big || now - last_handover_ns_ >= kHandoverNs) {
      StreamWriter::instance().hand_over(&stream_);
      last_handover_ns_ = now;
    }
  }
}

void ThreadRecorder::on_end(const at::RecordFunction& fn) {
  if (busy_ || depth_ == 0) return;
  // Pop to the matching frame; RecordFunctions end in LIFO order on a thread.
  size_t i = depth_;
  while (i > 0 && frames_[i - 1].handle != fn.handle()) --i;
  if (i == 0) return;
  Frame& f = frames_[i - 1];
  depth_ = i - 1;

  switch (f.marker) {
    case Marker::kOptimizerStep:
      --optimizer_step_depth_;
      if (--optimizer_depth_ == 0) ProcessRecorder::instance().mark_step_end();
      return;
    case Marker::kOptimizerOther:
      --optimizer_depth_;
      return;
    case Marker::kStep:
      ProcessRecorder::instance().mark_step_end();
      return;
    case Marker::kBackwardNode:
      --backward_depth_;
      backward_seen_in_step_ = true;
      return;
    case Marker::kNone:
      break;
  }
  --op_depth_;
  if (f.backward) {
    --backward_depth_;
    backward_seen_in_step_ = true;
  }
  if (!f.recorded && f.info && f.info->writes && !f.info->metadata_only) {
    // A write we do not record still changes bytes the cache describes.
    for (const c10::IValue& v : fn.outputs())
      if (v.isTensor() && v.toTensor().defined())
        if (StorageEntry* st = storage_of(v.toTensor())) ++st->writes;
  }
  if (f.recorded && produced_fake_tensor(fn.outputs())) f.recorded = false;
  if (f.recorded) {
    busy_ = true;
    try {
      write_record(f, fn);
    } catch (const std::exception& e) {
      // Never throw into libtorch. The partial record is dropped, the stream stays whole.
      report_swallowed(fn.name(), e.what());
      stream_.bytes.resize(stream_.committed.load());
    }
    busy_ = false;
  }
  items_.resize(f.items_begin);
  bytes_.resize(f.bytes_begin);
  bytes_item_start_ = bytes_.size();
  snaps_top_ = f.snaps_begin;
}

}  // namespace detaudit::hooks
