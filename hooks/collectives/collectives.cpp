#include "collectives/collectives.h"

#include <cstring>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace detaudit::hooks {
namespace {

// A torchbind object of this c10d class ("ProcessGroup", "Work"), as its holder.
c10::intrusive_ptr<torch::CustomClassHolder> holder_of(const c10::IValue& v, const char* cls) {
  if (!v.isObject()) return {};
  const auto& obj = v.toObjectRef();
  auto name = obj.type()->name();
  if (!name || name->qualifiedName() != std::string("__torch__.torch.classes.c10d.") + cls)
    return {};
  if (obj.slots().size() != 1 || !obj.getSlot(0).isCapsule()) return {};
  return obj.getSlot(0).toCapsule();
}

}  // namespace

CollectiveShape collective_shape(std::string_view name) {
  constexpr std::string_view prefix = "c10d::";
  if (name.substr(0, prefix.size()) != prefix) return {};
  name.remove_prefix(prefix.size());
  CollectiveShape s;
  if (name == "allreduce_" || name == "allreduce_coalesced_" || name == "reduce_") {
    s.recv_arg = s.send_arg = 0;
  } else if (name == "broadcast_") {
    s.recv_arg = s.send_arg = 0;
    s.root_arg = 2;
  } else if (name == "allgather_" || name == "_allgather_base_" || name == "allgather_coalesced_" ||
             name == "allgather_into_tensor_coalesced_" || name == "reduce_scatter_" ||
             name == "_reduce_scatter_base_" || name == "reduce_scatter_tensor_coalesced_" ||
             name == "alltoall_" || name == "alltoall_base_" || name == "gather_" ||
             name == "scatter_") {
    s.recv_arg = 0;
    s.send_arg = 1;
  } else if (name == "send") {
    s.send_arg = 0;
  } else if (name == "recv_" || name == "recv_any_source_") {
    s.recv_arg = 0;
  } else if (name == "barrier" || name == "monitored_barrier_") {
    s.is_barrier = true;
  }
  return s;
}

GroupView find_group(c10::ArrayRef<const c10::IValue> inputs) {
  for (const c10::IValue& v : inputs) {
    auto holder = holder_of(v, "ProcessGroup");
    if (!holder) continue;
    auto* pg = static_cast<c10d::ProcessGroup*>(holder.get());
    return GroupView{pg, pg->getRank(), pg->getSize()};
  }
  return {};
}

c10::intrusive_ptr<c10::ivalue::Object> find_work(const std::vector<c10::IValue>& outputs) {
  for (const c10::IValue& v : outputs) {
    if (holder_of(v, "Work")) return v.toObject();
    if (v.isTuple())
      for (const c10::IValue& e : v.toTupleRef().elements())
        if (holder_of(e, "Work")) return e.toObject();
  }
  return {};
}

bool work_completed(const c10::intrusive_ptr<c10::ivalue::Object>& work) {
  auto holder = holder_of(c10::IValue(work), "Work");
  return !holder || static_cast<c10d::Work*>(holder.get())->isCompleted();
}

c10::intrusive_ptr<c10::ivalue::Future> work_future(
    const c10::intrusive_ptr<c10::ivalue::Object>& work) {
  auto holder = holder_of(c10::IValue(work), "Work");
  if (!holder) return {};
  try {
    return static_cast<c10d::Work*>(holder.get())->getFuture();
  } catch (const std::exception&) {
    return {};  // the base Work has none ("getFuture is not supported")
  }
}

void tensors_of(const c10::IValue& v, std::vector<at::Tensor>* out) {
  if (v.isTensor()) {
    if (v.toTensor().defined()) out->push_back(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList())
      if (t.defined()) out->push_back(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) tensors_of(e, out);
  }
}

}  // namespace detaudit::hooks
