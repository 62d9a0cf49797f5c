// Buffered op reading and alignment keys for the comparator.
#include "diff/op_source.h"

#include <algorithm>

namespace detaudit {
namespace {

inline uint64_t mix(uint64_t h, uint64_t v) {
  v *= 0x9e3779b97f4a7c15ull;
  h ^= v ^ (v >> 29);
  return h * 0xbf58476d1ce4e5b9ull + 0x94d049bb133111ebull;
}

uint64_t hash_name(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

OpSource::OpSource(trace::TraceReader* reader)
    : reader_(reader), ring_(kCapacity), first_tensor_(kCapacity, 0) {}

const trace::StepInfo* OpSource::step_info(uint64_t step) const {
  if (step < step_shift_) return nullptr;
  step -= step_shift_;
  const auto& steps = reader_->steps();
  auto it = std::lower_bound(steps.begin(), steps.end(), step,
                             [](const trace::StepInfo& s, uint64_t v) { return s.step < v; });
  if (it != steps.end() && it->step == step) return &*it;
  for (const trace::StepInfo& s : steps)  // steps need not be sorted (a restarted counter)
    if (s.step == step) return &s;
  return nullptr;
}

uint64_t OpSource::key_of(const trace::OpRecord& op) {
  while (name_hash_.size() <= op.name) name_hash_.push_back(0);
  uint64_t& nh = name_hash_[op.name];
  if (nh == 0) nh = hash_name(reader_->string(op.name)) | 1;
  uint64_t h = mix(nh, uint64_t(op.phase) | (uint64_t(op.depth) << 8));
  for (const auto* ids : {&op.input_tensors, &op.output_tensors}) {
    h = mix(h, ids->size());
    for (int64_t id : *ids) {
      const trace::TensorDesc* t = reader_->tensor(id);
      if (!t) continue;
      h = mix(h, uint64_t(t->dtype) | (uint64_t(t->device_type) << 8));
      for (int64_t s : t->sizes) h = mix(h, uint64_t(s));
    }
  }
  return h;
}

void OpSource::copy_output_digests(BufferedOp* b) const {
  OutputDigests& out = b->outputs;
  const auto& ids = b->rec.output_tensors;
  out.present = false;
  out.results = b->rec.results_hash;
  if (ids.size() > OutputDigests::kMax) return;
  out.count = uint8_t(ids.size());
  out.compared = 0;
  out.digest_len = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const trace::TensorDesc* t = reader_->tensor(ids[i]);
    if (!t) return;
    if (t->uninitialized()) continue;  // outputs_differ skips it
    out.compared |= uint8_t(1u << i);
    out.digest_len = t->digest_len;
    std::memcpy(out.digests[i].data(), t->digest.data(), t->digest_len);
  }
  out.present = true;
}

bool OpSource::is_collective(uint32_t name) {
  while (name_is_collective_.size() <= name) name_is_collective_.push_back(-1);
  int8_t& known = name_is_collective_[name];
  if (known < 0) known = reader_->string(name).substr(0, 6) == "c10d::";
  return known;
}

void OpSource::attach(const trace::CollectiveRecord& c) {
  // The op is still buffered unless its Work took longer than the look-ahead to complete.
  for (size_t i = count_; i-- > 0;) {
    BufferedOp& b = at(i);
    if (b.rec.order != c.info.op_order) continue;
    if (!b.collective || b.received) return;
    b.received = true;
    b.coll = c.info;
    --awaiting_;
    if (c.info.state != trace::kCollectiveCompleted) return;
    b.rec.outputs = c.values;
    b.rec.output_tensors = c.tensors;
    copy_output_digests(&b);
    return;
  }
}

std::string OpSource::allocated_by(int64_t id) const {
  auto it = allocations_.find(id);
  if (it == allocations_.end()) return "";
  return std::string(reader_->string(it->second.name)) + " (op #" +
         std::to_string(it->second.index) + ")";
}

void OpSource::note_optimizer(const trace::OpRecord& op) {
  if (op.scope_path == label_scope_ && op.step == label_step_) return;  // this step's, noted
  if (op.scope_path != label_scope_) {
    label_scope_ = op.scope_path;
    label_.reset();
    if (op.scope_path != UINT32_MAX)
      label_ = trace::find_optimizer_step_label(reader_->string(op.scope_path));
  }
  label_step_ = op.step;
  if (!label_) return;
  optimizer_ordinals_.insert(label_->ordinal);
  step_optimizers_.try_emplace(op.step, *label_);
}

bool OpSource::read_one() {
  if (stopped_) return false;
  for (;;) {
    const size_t slot = (head_ + count_) % kCapacity;
    BufferedOp& b = ring_[slot];
    trace::ReadResult r = reader_->next_into(&b.rec);  // decoded in place: no copy per op
    if (r != trace::ReadResult::kRecord) {
      stopped_ = true;
      stop_result_ = r;
      return false;
    }
    ++records_;
    if (reader_->kind() == trace::RecordKind::kCollective) attach(reader_->collective());
    if (reader_->kind() != trace::RecordKind::kOp) continue;
    b.rec.step += step_shift_;
    if (b.rec.step < first_step_) continue;
    if (skip_ > 0) {
      --skip_;
      continue;
    }
    if (b.rec.step > last_step_) {
      stopped_ = stopped_at_limit_ = true;
      stop_result_ = trace::ReadResult::kEof;
      return false;
    }
    if (tap_) tap_(*reader_, b.rec);
    max_step_ = std::max(max_step_, b.rec.step);
    const bool backward = b.rec.phase == trace::Phase::kBackward;
    if (backward && !in_backward_) ++backward_passes_;
    in_backward_ = backward;
    if (b.rec.phase == trace::Phase::kOptimizer) {
      ++optimizer_ops_;
      note_optimizer(b.rec);
    }
    last_op_ = {b.rec.name, b.rec.step, ops_read_, b.rec.order};
    b.index = ops_read_++;
    b.key = key_of(b.rec);
    if (b.rec.bits & trace::kOpCompiledRegion) {
      last_region_ = b.rec.name;
      last_region_step_ = b.rec.step;
      if (std::find(compiled_regions_.begin(), compiled_regions_.end(), b.rec.name) ==
          compiled_regions_.end())
        compiled_regions_.push_back(b.rec.name);
    }
    b.compiled_region = last_region_step_ == b.rec.step ? last_region_ : BufferedOp::kNoRegion;
    if (trace::is_compiled_kernel(reader_->string(b.rec.name))) ++compiled_kernels_;
    copy_output_digests(&b);
    for (int64_t id : b.rec.output_tensors) {
      const trace::TensorDesc* t = reader_->tensor(id);
      if (!t || !t->uninitialized()) continue;
      if (allocations_.size() >= (1u << 16)) allocations_.clear();  // bounded, like the window
      allocations_[id] = {b.rec.name, b.index};
    }
    b.collective = is_collective(b.rec.name);
    b.received = false;
    b.coll = {};
    if (b.collective) ++awaiting_;
    first_tensor_[slot] = reader_->tensors_seen();
    ++count_;
    return true;
  }
}

size_t OpSource::fill(size_t n) {
  n = std::min(n, kCapacity);
  // A buffered collective's receive buffers come in a later record: read on until it arrives.
  while (count_ < n || (awaiting_ > 0 && count_ < kCapacity)) {
    // Keep every buffered op's tensors inside the reader's reference window.
    if (count_ > 0 &&
        reader_->tensors_seen() - first_tensor_[head_] > int64_t(trace::kRefWindow / 2))
      break;
    if (!read_one()) break;
  }
  return count_;
}

void OpSource::pop(size_t n) {
  n = std::min(n, count_);
  for (size_t i = 0; i < n; ++i)
    if (at(i).collective && !at(i).received) --awaiting_;
  head_ = (head_ + n) % kCapacity;
  count_ -= n;
}

}  // namespace detaudit
