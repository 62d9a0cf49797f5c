// hooks/ops: what an op is: its schema (view, in place, random, what it overwrites), its phase,
// step and user scopes, the generator it draws from; where torch's versions differ.
//
// What the recorder needs to know about an op, read once per op from its schema and its name:
// is it a view, does it write an argument, which arguments it overwrites without reading, which
// outputs hold bytes no kernel wrote. The rules for what a schema does not say are listed here.
#pragma once

#include <ATen/core/function_schema.h>

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "ops/torch_compat.h"

namespace detaudit::hooks {

// What an op's output holds, known from its arguments without reading it: a fill's bytes are its
// value repeated, a copy's those of its source (same dtype, device and shape).
enum class KnownOutput : uint8_t { kNone, kFill, kZero, kCopy };

// An argument an op may write and does not return: a list (`Tensor(a!)[]` of the foreach and
// fused optimizers, an out= list), or a tensor beside what it returns (batch norm's running
// statistics). Its bytes after the op are recorded as if returned (the OP record's written
// section, docs/trace-format.md), so a write no return shows is still compared.
struct UnreturnedWrite {
  uint8_t index = 0;  // among the op's arguments
  bool list = false;  // a list of tensors, else one (optional) tensor
  std::string name;   // the schema's name for it: "exp_avgs"
};

struct OpInfo {
  std::string name;
  uint32_t name_id = 0;  // in the stream's string table; UINT32_MAX: not interned yet
  bool selected = true;  // the config's op filter
  bool is_view = false;  // returns an alias it does not write: its data is its base's
  bool is_random = false;
  bool returns_uninitialized = false;  // empty, resize_: bytes no op wrote
  bool writes = false;                 // writes an argument in place (`Tensor(a!)`)
  bool metadata_only = false;          // in place on sizes and strides only (as_strided_, t_, ...)
  bool compiled_region = false;        // a torch.compile region: its kernels are not seen
  bool repoints_storage = false;       // set_: the output's bytes are another storage's
  bool scope_bookkeeping = false;      // record_function's own enter/exit ops: a label, not work
  uint64_t scratch_outputs = 0;        // outputs (by index) that are partly written scratch space
  // Implemented only through other ops (a Composite kernel): its outputs are what its nested
  // ops described. A backend kernel may write its outputs directly after a nested op ran
  // (addmm copies the bias with copy_, then a GEMM adds the product in place).
  bool composite = false;
  // Has a kernel of its own (a dispatcher op, not Composite): that kernel may write what its
  // nested ops returned after they end (sum fills its output with a nested fill_, then adds).
  bool own_kernel = false;
  // Arguments (by index, up to 64) the op overwrites without reading: out= tensors, and self
  // of zero_, fill_, copy_, resize_ and the random fills. Their old bytes are not hashed.
  uint64_t overwritten_args = 0;
  // Those it writes in full (all but self of resize_, resize_as_ and set_): their old bytes
  // reach no one after this op (TENSOR_WRITTEN).
  uint64_t written_args = 0;
  // Every argument it may write (`Tensor(a!)`, `Tensor(a!)[]`), by index, up to 64: the one
  // answer to "what does this op write", for the device batch's write guards, the tensor cache
  // and the written section. Empty for c10d collectives, whose schemas say nothing of it.
  uint64_t mutable_args = 0;
  // Those it does not return (a return in the same alias set, `-> Tensor(a!)`, returns it).
  std::vector<UnreturnedWrite> unreturned_writes;
  CollectiveShape collective;
  // The `layout` argument of the empty family: given explicitly (not None) by the tensor
  // constructors (torch.tensor, as_tensor), which fill the buffer outside the dispatcher.
  int8_t layout_arg = -1;  // a c10d collective's send and receive arguments
  // fill_.Scalar, zero_, copy_: their self, as they return it (the device digest's batches need
  // not hold what it says).
  KnownOutput known_output = KnownOutput::kNone;

  bool recorded() const { return !is_view && !metadata_only && !scope_bookkeeping && selected; }
};

// `op_name` is the dispatcher's name and overload, absent for records that are not ops.
OpInfo describe_op(const char* name, const OptionalOperatorName& op_name, bool selected);

// torch.compile's regions: the dynamo frame, and the AOT autograd function forward and backward.
bool is_compiled_region(std::string_view name);

// A schema's write set, as describe_op reads it: "name.overload<TAB>mutable args<TAB>unreturned
// ones", argument indices joined by ",". For the property test over the operator registry
// (`detaudit_replay --write-sets`, tests/e2e/test_write_sets.py).
std::string describe_write_set(const c10::FunctionSchema& schema);

}  // namespace detaudit::hooks
