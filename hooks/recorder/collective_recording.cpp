// Collectives on the op path: which arguments a rank reads, its receive buffers written as
// geometry when the op returns, and their contents, described when the Work's future completed,
// in a COLLECTIVE record (collectives.h and received_buffers.h say why).
#include <ATen/ATen.h>

#include "collectives/collectives.h"
#include "recorder/recorder.h"
#include "recorder/scoped.h"
#include "tensors/tensor_digest.h"

namespace detaudit::hooks {

using trace::ByteWriter;
using trace::ValueType;

void ProcessRecorder::next_collective(const void* group_key, trace::CollectiveInfo* info) {
  std::lock_guard<std::mutex> lock(groups_mu_);
  size_t i = 0;
  while (i < groups_.size() && groups_[i].first != group_key) ++i;
  if (i == groups_.size()) groups_.emplace_back(group_key, 0);
  info->group = i;
  info->seq = ++groups_[i].second;
  if (i == 0) adopt_group_rank(info->group_rank);
}

uint64_t ThreadRecorder::collective_overwritten(const at::RecordFunction& fn, const OpInfo& info,
                                                trace::CollectiveInfo* call) {
  auto inputs = fn.inputs();
  const GroupView group = find_group(inputs);
  call->group_rank = group.rank;
  call->group_size = uint64_t(std::max(group.size, 0));
  ProcessRecorder::instance().next_collective(group.key, call);
  const CollectiveShape& shape = info.collective;
  uint64_t overwritten = info.overwritten_args;
  // A broadcast's buffer is read on its root only; elsewhere it is a receive buffer.
  if (shape.root_arg >= 0 && size_t(shape.root_arg) < inputs.size() &&
      inputs[size_t(shape.root_arg)].isInt() &&
      inputs[size_t(shape.root_arg)].toInt() != group.rank)
    overwritten |= uint64_t(1) << shape.recv_arg;
  if (shape.recv_arg >= 0 && size_t(shape.recv_arg) < inputs.size())
    tensors_of(inputs[size_t(shape.recv_arg)], &starting_collective_->received);
  return overwritten;
}

void ThreadRecorder::emit_pending_output(const c10::IValue& v, ByteWriter& w) {
  if (v.isTensor() && v.toTensor().defined() && !unhashable_reason(v.toTensor())) {
    // Not filled yet: the COLLECTIVE record holds the contents.
    trace::TensorDesc& desc = desc_scratch_;
    describe_geometry(v.toTensor(), hasher_->length(), &desc);
    desc.bits |= trace::kTensorNotRead;
    write_new(w, desc, -1);
  } else if (v.isTensorList() || v.isList() || v.isTuple()) {
    std::vector<c10::IValue> elems;
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList()) elems.emplace_back(t);
    else if (v.isList())
      for (const c10::IValue& e : v.toListRef()) elems.push_back(e);
    else
      for (const c10::IValue& e : v.toTupleRef().elements()) elems.push_back(e);
    w.u8(uint8_t(ValueType::kList));
    w.varint(elems.size());
    for (const c10::IValue& e : elems) emit_pending_output(e, w);
  } else {
    static const OpInfo kPlain;
    Frame f;
    f.info = &kPlain;
    emit_output(v, w, f);
  }
}

void ThreadRecorder::follow_collective(PendingCollective& p,
                                       const std::vector<c10::IValue>& outputs) {
  // Its buffers change when the Work completes, unseen: what the cache says of them is void.
  for (const at::Tensor& t : p.received) cache_.wrote_unseen(t);
  const Config& config = ProcessRecorder::instance().config();
  p.buffers = std::make_shared<ReceivedBuffers>(std::move(p.received), config.digest, config.stats);
  p.received.clear();
  p.work = find_work(outputs);
  if (p.work) p.future = work_future(p.work);
  // Added before the caller holds the Work, so before any callback of the program's. Runs at
  // once, here, if the collective already completed.
  if (p.future)
    p.future->addCallback(
        [buffers = p.buffers](c10::ivalue::Future& f) { buffers->describe_once(f.hasError()); });
}

bool ThreadRecorder::unfilled_collective_buffer(const at::Tensor& t) {
  // No allocation: this runs for every tensor of every op while a collective is in flight.
  if (pending_collectives_.empty() || !t.defined() || !t.has_storage()) return false;
  const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  for (PendingCollective& p : pending_collectives_)
    for (const at::Tensor& r : p.buffers->tensors())
      if (r.has_storage() && r.storage().unsafeGetStorageImpl() == storage) return !p.ready();
  return false;
}

bool ThreadRecorder::returns_unfilled_buffer(const c10::IValue& v) {
  if (pending_collectives_.empty()) return false;
  if (v.isTensor()) return unfilled_collective_buffer(v.toTensor());
  if (v.isTensorList())
    for (const at::Tensor& t : v.toTensorList())
      if (unfilled_collective_buffer(t)) return true;
  return false;
}

bool ThreadRecorder::PendingCollective::ready() {
  if (buffers->described()) return true;
  if (future ? !future->completed() : work && !work_completed(work)) return false;
  // Or waits for the completing thread, which is at it.
  buffers->describe_once(future && future->hasError());
  return true;
}

void ThreadRecorder::emit_received(const at::Tensor& t, const ReceivedBuffers::Described& d,
                                   ByteWriter& w, uint64_t op_order) {
  if (d.skipped) {
    w.u8(uint8_t(ValueType::kTensorSkipped));
    w.varint(intern(d.skipped));
    return;
  }
  totals_.bytes_hashed += d.bytes;
  ++totals_.tensors_hashed;
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (impl->is_inference()) {
    write_new(w, d.desc, -1);
    return;
  }
  // The buffer's content when the collective completed, as if its op had written it: later
  // reads of that version refer to it; a later write, even one no op made, is hashed anew.
  TensorCache::Entry& e = cache_.remember(t, d.version, d.desc);
  e.written_order = op_order;
  e.id = write_new(w, e.desc, -1);
  cache_.wrote(t, d.version, e);
}

void ThreadRecorder::write_completed_collectives(bool at_end) {
  if (!stream_open_) return;
  // Described before the stream is entered: this may wait for the thread describing them.
  bool any = at_end;
  for (PendingCollective& p : pending_collectives_) any = p.ready() || any;
  if (!any) return;
  InBuffer in_buffer(&stream_);
  if (!in_buffer.entered()) return;
  Busy busy(&busy_);
  size_t kept = 0;
  try {
    for (size_t i = 0; i < pending_collectives_.size(); ++i) {
      PendingCollective& p = pending_collectives_[i];
      const bool done = p.buffers->described();
      if (!done && !at_end) {
        if (kept != i) pending_collectives_[kept] = std::move(p);
        ++kept;
        continue;
      }
      if (!done) p.info.state = trace::kCollectiveNotCompleted;
      const bool failed = done && p.buffers->failed();
      if (failed) p.info.state = trace::kCollectiveFailed;
      ByteWriter& w = encoder_.begin_collective(p.info);
      const std::vector<at::Tensor>& received = p.buffers->tensors();
      w.varint(done && !failed ? received.size() : 0);
      if (done && !failed)
        for (size_t k = 0; k < received.size(); ++k)
          emit_received(received[k], p.buffers->descriptions()[k], w, p.info.op_order);
      emit_string_records();
      encoder_.finish(sink());
      stream_.committed.store(stream_.bytes.size(), std::memory_order_release);
    }
  } catch (const std::exception&) {
    // Never throw into libtorch: the record was being encoded apart and is dropped; the buffer
    // holds whole records.
  }
  pending_collectives_.resize(kept);
}

}  // namespace detaudit::hooks
