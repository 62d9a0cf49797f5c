#include "ops/op_schema.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>

#include "trace/format.h"

namespace detaudit::hooks {
namespace {

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

// In-place ops that write every element of self and never read its bytes.
bool writes_all_of_self(std::string_view name) {
  static const char* kOps[] = {"aten::zero_",       "aten::fill_",        "aten::copy_",
                               "aten::normal_",     "aten::uniform_",     "aten::bernoulli_",
                               "aten::random_",     "aten::exponential_", "aten::geometric_",
                               "aten::log_normal_", "aten::cauchy_"};
  for (const char* op : kOps)
    if (name == op) return true;
  return false;
}

// In-place ops that never read self's bytes and write none: they resize or re-point it.
bool reshapes_self(std::string_view name) {
  return name == "aten::resize_" || name == "aten::resize_as_" || name == "aten::set_";
}

// Ops whose output holds bytes that no op wrote: the empty family, and resize_, which kernels
// call on their out= buffers (growing one leaves garbage; the kernel then writes it unseen).
bool returns_uninitialized(std::string_view name) {
  return name == "aten::empty" || name == "aten::empty_like" || name == "aten::empty_strided" ||
         name == "aten::new_empty" || name == "aten::new_empty_strided" ||
         name == "aten::empty_permuted" || name == "aten::resize_" || name == "aten::resize_as_";
}

// In-place by schema, yet they write no bytes: a stream noted for the caching allocator.
bool writes_no_bytes(std::string_view name) { return name == "aten::record_stream"; }

// Whether an argument of this type is a list (Tensor[], Tensor?[]), else one tensor.
bool is_list(const c10::TypePtr& type) { return type->kind() == c10::TypeKind::ListType; }

// Kernels that update batch norm's running statistics in training while their schemas leave
// `running_mean` and `running_var` unmarked (`Tensor?`, not `Tensor(a!)?`): read as written.
// Unmarked, the tensor cache took them for unchanged and recorded their first bytes at every
// step. (`_native_batch_norm_legit` and `_batch_norm_with_update` mark theirs.)
bool writes_unmarked_running_statistics(std::string_view name) {
  return name == "aten::native_batch_norm" || name == "aten::cudnn_batch_norm" ||
         name == "aten::miopen_batch_norm" || name == "aten::batch_norm_gather_stats_with_counts";
}

KnownOutput known_output(std::string_view name, std::string_view overload) {
  if (name == "aten::fill_" && overload == "Scalar") return KnownOutput::kFill;
  if (name == "aten::zero_" && overload.empty()) return KnownOutput::kZero;
  if (name == "aten::copy_" && overload.empty()) return KnownOutput::kCopy;
  return KnownOutput::kNone;
}

}  // namespace

bool is_compiled_region(std::string_view name) {
  return starts_with(name, "Torch-Compiled Region") || name == "CompiledFunction" ||
         name == "CompiledFunctionBackward";
}

namespace {

// What the op's name alone says.
OpInfo describe_by_name(const char* name) {
  OpInfo info;
  info.name = name;
  info.returns_uninitialized = returns_uninitialized(name);
  info.metadata_only = is_metadata_only(name);
  info.compiled_region = is_compiled_region(name);
  info.repoints_storage = std::string_view(name) == "aten::set_";
  // torch.profiler.record_function's ops open and close a user scope (torch >= 2.0).
  info.scope_bookkeeping = starts_with(name, "profiler::_record_function_");
  info.scratch_outputs = scratch_outputs(name);
  info.collective = collective_shape(name);
  // Receive buffers hold whatever they held (often `empty`'s bytes) until the Work completes.
  if (info.collective.recv_arg >= 0 && info.collective.recv_arg != info.collective.send_arg) {
    info.overwritten_args |= uint64_t(1) << info.collective.recv_arg;
    info.written_args |= uint64_t(1) << info.collective.recv_arg;
  }
  return info;
}

// What its schema says: views, writes (the write set), generators, layout.
void read_schema(const c10::FunctionSchema& schema, OpInfo* out);

}  // namespace

OpInfo describe_op(const char* name, const OptionalOperatorName& op_name, bool selected) {
  OpInfo info = describe_by_name(name);
  info.selected = selected;
  if (!op_name) return info;
  info.known_output = known_output(name, op_name->overload_name);
  auto handle = c10::Dispatcher::singleton().findOp(*op_name);
  if (!handle) return info;
  info.composite = handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) ||
                   handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd);
  // A kernel inductor generated runs from a Python implementation registered Composite, yet it
  // writes raw memory the dispatcher never sees: its outputs are always read.
  if (trace::is_compiled_kernel(name)) info.composite = false;
  info.own_kernel = !info.composite;
  // Random ops without a Generator argument (native_dropout, rand, randperm, the RNN and
  // attention kernels with dropout) carry the tag; on CUDA they draw from the device's generator.
  info.is_random = handle->hasTag(at::Tag::nondeterministic_seeded);
  read_schema(handle->schema(), &info);
  return info;
}

namespace {

void read_schema(const c10::FunctionSchema& schema, OpInfo* out) {
  OpInfo& info = *out;
  const std::string_view name = info.name;
  for (const auto& ret : schema.returns()) {
    const auto* alias = ret.alias_info();
    if (alias && !alias->isWrite()) info.is_view = true;
  }
  // The alias sets the op returns written: `add_(Tensor(a!) self) -> Tensor(a!)`.
  std::vector<c10::Symbol> returned;
  for (const auto& ret : schema.returns())
    if (ret.alias_info() && ret.alias_info()->isWrite())
      for (const c10::Symbol& set : ret.alias_info()->beforeSets()) returned.push_back(set);
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::Argument& arg = args[i];
    const bool unmarked_write = !arg.alias_info() &&
                                (arg.name() == "running_mean" || arg.name() == "running_var") &&
                                writes_unmarked_running_statistics(name);
    if (unmarked_write && i < 64) {
      info.writes = true;
      info.mutable_args |= uint64_t(1) << i;
      info.unreturned_writes.push_back({uint8_t(i), false, arg.name()});
    }
    if (arg.alias_info() && arg.alias_info()->isWrite()) {
      info.writes = true;
      if (i < 64) info.mutable_args |= uint64_t(1) << i;
      bool is_returned = false;
      for (const c10::Symbol& set : arg.alias_info()->beforeSets())
        is_returned |= std::find(returned.begin(), returned.end(), set) != returned.end();
      if (!is_returned && i < 64 && !info.metadata_only && !writes_no_bytes(name) &&
          !info.collective.defined())
        info.unreturned_writes.push_back({uint8_t(i), is_list(arg.type()), arg.name()});
      const bool self = arg.name() == "self";
      const bool written = arg.is_out() || (self && writes_all_of_self(name));
      if (i < 64 && written) info.written_args |= uint64_t(1) << i;
      if (i < 64 && (written || (self && reshapes_self(name))))
        info.overwritten_args |= uint64_t(1) << i;
    }
    if (info.returns_uninitialized && arg.name() == "layout" && i < 64) info.layout_arg = int8_t(i);
    c10::TypePtr type = arg.type();
    if (type->kind() == c10::TypeKind::OptionalType) type = type->containedType(0);
    if (type->kind() == c10::TypeKind::GeneratorType) info.is_random = true;
  }
}

}  // namespace

std::string describe_write_set(const c10::FunctionSchema& schema) {
  OpInfo info = describe_by_name(schema.name().c_str());
  read_schema(schema, &info);
  std::string line = schema.name() + "." + schema.overload_name() + "\t";
  const char* sep = "";
  for (size_t i = 0; i < 64; ++i)
    if (info.mutable_args >> i & 1) {
      line += sep + std::to_string(i);
      sep = ",";
    }
  line += "\t";
  sep = "";
  for (const UnreturnedWrite& w : info.unreturned_writes) {
    line += sep + std::to_string(w.index);
    sep = ",";
  }
  return line;
}

}  // namespace detaudit::hooks
