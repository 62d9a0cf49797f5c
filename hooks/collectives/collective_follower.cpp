#include "collectives/collective_follower.h"

#include <utility>

#include "util/check.h"

namespace detaudit::hooks {

uint64_t CollectiveFollower::start(c10::ArrayRef<const c10::IValue> inputs,
                                   const CollectiveShape& shape, const GroupView& group,
                                   uint64_t overwritten, const trace::CollectiveInfo& info) {
  DETAUDIT_DCHECK(!starting_, "collectives do not nest: one begins at a time");
  starting_.emplace();
  starting_->info = info;
  // A broadcast's buffer is read on its root only; elsewhere it is a receive buffer.
  if (shape.root_arg >= 0 && size_t(shape.root_arg) < inputs.size() &&
      inputs[size_t(shape.root_arg)].isInt() &&
      inputs[size_t(shape.root_arg)].toInt() != group.rank)
    overwritten |= uint64_t(1) << shape.recv_arg;
  if (shape.recv_arg >= 0 && size_t(shape.recv_arg) < inputs.size())
    tensors_of(inputs[size_t(shape.recv_arg)], &starting_->received);
  return overwritten;
}

void CollectiveFollower::returned(const std::vector<c10::IValue>& outputs, trace::DigestAlgo algo,
                                  bool stats) {
  Pending& p = *starting_;
  p.buffers = std::make_shared<ReceivedBuffers>(std::move(p.received), algo, stats);
  p.received.clear();
  p.work = find_work(outputs);
  if (p.work) p.future = work_future(p.work);
  // Added before the caller holds the Work, so before any callback of the program's. Runs at
  // once, here, if the collective already completed.
  if (p.future)
    p.future->addCallback(
        [buffers = p.buffers](c10::ivalue::Future& f) { buffers->describe_once(f.hasError()); });
  pending_.push_back(std::move(p));
  starting_.reset();
}

bool CollectiveFollower::unfilled_buffer_in_flight(const at::Tensor& t) {
  // No allocation: this runs for every tensor of every op while a collective is in flight.
  if (!t.defined() || !t.has_storage()) return false;
  const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  for (Pending& p : pending_)
    for (const at::Tensor& r : p.buffers->tensors())
      if (r.has_storage() && r.storage().unsafeGetStorageImpl() == storage) return !p.ready();
  return false;
}

bool CollectiveFollower::unfilled_value_in_flight(const c10::IValue& v) {
  if (v.isTensor()) return unfilled_buffer_in_flight(v.toTensor());
  if (v.isTensorList())
    for (const at::Tensor& t : v.toTensorList())
      if (unfilled_buffer_in_flight(t)) return true;
  return false;
}

bool CollectiveFollower::Pending::ready() {
  if (buffers->described()) return true;
  if (future ? !future->completed() : work && !work_completed(work)) return false;
  // Or waits for the completing thread, which is at it.
  buffers->describe_once(future && future->hasError());
  return true;
}

bool CollectiveFollower::any_due(bool at_end) {
  // Described here, if need be: this may wait for the thread describing them.
  bool any = at_end;
  for (Pending& p : pending_) any = p.ready() || any;
  return any;
}

std::vector<CollectiveFollower::Pending> CollectiveFollower::take_due(bool at_end) {
  std::vector<Pending> due;
  size_t kept = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending& p = pending_[i];
    const bool done = p.buffers->described();
    if (!done && !at_end) {
      if (kept != i) pending_[kept] = std::move(p);
      ++kept;
      continue;
    }
    if (!done) p.info.state = trace::kCollectiveNotCompleted;
    if (done && p.buffers->failed()) p.info.state = trace::kCollectiveFailed;
    due.push_back(std::move(p));
  }
  pending_.resize(kept);
  return due;
}

void CollectiveFollower::clear() {
  starting_.reset();
  pending_.clear();
}

}  // namespace detaudit::hooks
