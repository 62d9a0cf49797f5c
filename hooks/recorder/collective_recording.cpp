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

uint64_t ThreadRecorder::start_collective(const at::RecordFunction& fn, const OpInfo& info,
                                          uint64_t order) {
  auto inputs = fn.inputs();
  const GroupView group = find_group(inputs);
  trace::CollectiveInfo call;
  call.op_order = order;
  call.group_rank = group.rank;
  call.group_size = uint64_t(std::max(group.size, 0));
  ProcessRecorder::instance().next_collective(group.key, &call);
  return collectives_.start(inputs, info.collective, group, info.overwritten_args, call);
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

void ThreadRecorder::emit_received(const at::Tensor& t, const ReceivedBuffers::Described& d,
                                   ByteWriter& w, uint64_t op_order) {
  if (d.skipped) {
    w.u8(uint8_t(ValueType::kTensorSkipped));
    w.varint(sink_.intern(d.skipped));
    return;
  }
  sink_.totals().bytes_hashed += d.bytes;
  ++sink_.totals().tensors_hashed;
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
  if (!sink_.started()) return;
  // Described before the stream is entered: this may wait for the thread describing them.
  if (!collectives_.any_due(at_end)) return;
  InBuffer in_buffer = sink_.enter();
  if (!in_buffer.entered()) return;
  Busy busy(&busy_);
  try {
    for (CollectiveFollower::Pending& p : collectives_.take_due(at_end)) {
      const bool contents = p.info.state != trace::kCollectiveNotCompleted &&
                            p.info.state != trace::kCollectiveFailed;
      ByteWriter& w = sink_.encoder().begin_collective(p.info);
      const std::vector<at::Tensor>& received = p.buffers->tensors();
      w.varint(contents ? received.size() : 0);
      if (contents)
        for (size_t k = 0; k < received.size(); ++k)
          emit_received(received[k], p.buffers->descriptions()[k], w, p.info.op_order);
      sink_.write_strings();
      sink_.encoder().finish(sink_.out());
      sink_.commit();
    }
  } catch (const std::exception&) {
    // Never throw into libtorch: the record was being encoded apart and is dropped; the buffer
    // holds whole records.
  }
}

}  // namespace detaudit::hooks
