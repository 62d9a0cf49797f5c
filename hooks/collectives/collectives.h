// hooks/collectives: c10d collectives: what a rank sends and receives into, its process group,
// and the receive buffers described the moment the Work completes.
//
// c10d collectives as the recorder sees them: which arguments a rank sends and which it receives
// into, its process group (rank, size, and an identity that pairs across ranks and runs), and
// whether its Work has completed. The only file that includes c10d's headers.
//
// A collective returns at once with a Work; gloo fills the receive buffers later, on its own
// thread. So the recorder writes the op when it returns, with its receive buffers as geometry
// ("not read"), describes their contents when the Work's future completes (received_buffers.h),
// and writes them in a COLLECTIVE record at the thread's next op after that: never waited for.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <vector>

namespace detaudit::hooks {

// Where a collective's tensors are among its arguments (same positions in torch 1.13 and 2.x).
struct CollectiveShape {
  int8_t recv_arg = -1;  // written by the collective, not read (-1: none)
  int8_t send_arg = -1;  // read; the same as recv_arg for all-reduce, reduce and broadcast
  int8_t root_arg = -1;  // broadcast's root rank: only the root sends
  bool defined() const { return recv_arg >= 0 || send_arg >= 0 || is_barrier; }
  bool is_barrier = false;
};

// The shape of a c10d op by name, or an undefined shape for any other op.
CollectiveShape collective_shape(std::string_view op_name);

// A process group, as one collective call saw it.
struct GroupView {
  const void* key = nullptr;  // the ProcessGroup object, for this process's registry
  int rank = -1, size = 0;
};

// The process group among an op's inputs, if any.
GroupView find_group(c10::ArrayRef<const c10::IValue> inputs);

// The Work among an op's outputs (a (tensors, Work) tuple or a Work), or null.
c10::intrusive_ptr<c10::ivalue::Object> find_work(const std::vector<c10::IValue>& outputs);

// Completed (successfully or not); never blocks.
bool work_completed(const c10::intrusive_ptr<c10::ivalue::Object>& work);

// The Work's future, or null for a Work that has none. gloo completes it before the Work itself:
// a program waiting on it (DDP's reducer) runs on while the Work still reads not completed.
c10::intrusive_ptr<c10::ivalue::Future> work_future(
    const c10::intrusive_ptr<c10::ivalue::Object>& work);

// The tensors of one argument, lists of lists flattened.
void tensors_of(const c10::IValue& v, std::vector<at::Tensor>* out);

}  // namespace detaudit::hooks
