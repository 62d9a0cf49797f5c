#include "diff/roles.h"

#include "diff/report_model.h"

namespace detaudit {

const char* tensor_role_name(TensorRole role) {
  switch (role) {
    case TensorRole::kUnknown: return "";
    case TensorRole::kParameter: return "parameter";
    case TensorRole::kGradient: return "gradient";
    case TensorRole::kOptimizerState: return "optimizer state";
    case TensorRole::kModelBuffer: return "model buffer";
    case TensorRole::kHyperparameter: return "hyperparameter";
    case TensorRole::kBatch: return "batch";
    case TensorRole::kRandomDraw: return "random draw";
    case TensorRole::kActivation: return "activation";
    case TensorRole::kEvaluation: return "evaluation";
    case TensorRole::kOutsideTraining: return "outside training";
  }
  return "";
}

bool is_training_state(TensorRole role) {
  return role == TensorRole::kParameter || role == TensorRole::kGradient ||
         role == TensorRole::kOptimizerState || role == TensorRole::kModelBuffer ||
         role == TensorRole::kHyperparameter;
}

namespace {

uint8_t reader_bit(trace::Phase phase) {
  switch (phase) {
    case trace::Phase::kForward: return 1;
    case trace::Phase::kBackward: return 2;
    case trace::Phase::kOptimizer: return 4;
    case trace::Phase::kOther: return 8;
  }
  return 8;
}

}  // namespace

bool writes_training_state(const trace::OpRecord& op) {
  if (op.phase != trace::Phase::kForward) return !op.output_tensors.empty();
  return op.returned_tensors < op.output_tensors.size();
}

RoleTracker::Fact* RoleTracker::fact(int64_t id) {
  if (id < 0 || id >= kMaxIds) return nullptr;
  if (size_t(id) >= facts_.size()) facts_.resize(size_t(id) + 1);
  return &facts_[size_t(id)];
}

const RoleTracker::Fact* RoleTracker::fact(int64_t id) const {
  return id >= 0 && size_t(id) < facts_.size() ? &facts_[size_t(id)] : nullptr;
}

int64_t RoleTracker::base_of(int64_t id) const {
  for (int hops = 0; hops < 64; ++hops) {
    auto it = view_base_.find(id);
    if (it == view_base_.end()) return id;
    id = it->second;
  }
  return id;
}

void RoleTracker::see(const trace::OpRecord& op, const trace::TraceReader& r) {
  const uint8_t bit = uint8_t(
      reader_bit(op.phase) |
      (op.phase == trace::Phase::kForward && !op.grad_off ? kReadForwardGradOn : 0));
  bool read_forward_read = false, read_gradient = false;
  for (size_t i = 0; i < op.input_tensors.size(); ++i) {
    const int64_t id = op.input_tensors[i];
    if (id >= next_unseen_) {
      const trace::TensorDesc* t = r.tensor(id);
      if (t && t->provenance() == trace::Provenance::kView && t->base_id >= 0)
        view_base_[id] = t->base_id;
      if (Fact* f = fact(id)) f->maker = kExternal;
      next_unseen_ = id + 1;
    }
    if (op.input_written(i)) continue;  // overwritten, not read
    const int64_t base = base_of(id);
    for (int64_t seen : {id, base})
      if (Fact* f = fact(seen)) {
        read_forward_read |= (f->readers & kReadForward) != 0;
        read_gradient |= f->maker == kBackward;
        f->readers |= bit;
      }
  }
  const bool scaler_update = r.string(op.name) == "aten::_amp_update_scale_";
  for (size_t i = 0; i < op.output_tensors.size(); ++i) {
    const int64_t id = op.output_tensors[i];
    if (id < next_unseen_) continue;  // a version already made (an outer op's, a pass-through)
    next_unseen_ = id + 1;
    const trace::TensorDesc* t = r.tensor(id);
    if (t && t->provenance() == trace::Provenance::kView && t->base_id >= 0)
      view_base_[id] = t->base_id;
    Fact* f = fact(id);
    if (!f) continue;
    switch (op.phase) {
      case trace::Phase::kForward:
        f->maker = op.is_random()                ? kRandom
                   : op.output_is_written_arg(i) ? kForwardWrittenArgument
                                                 : kForward;
        break;
      case trace::Phase::kBackward: f->maker = kBackward; break;
      case trace::Phase::kOptimizer: f->maker = kOptimizer; break;
      case trace::Phase::kOther: f->maker = kOther; break;
    }
    f->maker_read_parameter_candidate = read_forward_read;
    f->made_grad_off = op.grad_off;
    f->maker_read_gradient = read_gradient;
    // Which op wrote it, as the data flow allows: GradScaler's scale is what its update writes.
    f->scaler_scale = op.phase == trace::Phase::kForward && scaler_update;
  }
}

void RoleTracker::spread(const trace::OpRecord& op, bool watched) {
  uint32_t from = 0;
  for (size_t i = 0; i < op.input_tensors.size(); ++i) {
    if (op.input_written(i)) continue;
    const int64_t id = op.input_tensors[i];
    for (int64_t seen : {id, base_of(id)})
      if (auto it = taint_.find(seen); it != taint_.end()) from |= it->second;
  }
  if (watched)
    for (const Watched& w : watched_inputs_) from |= w.bit;
  if (!from) return;
  for (int64_t id : op.output_tensors) taint_[id] |= from;
  if (writes_training_state(op)) reached_ |= from;
}

void RoleTracker::op(const trace::OpRecord& op, const trace::TraceReader& r, bool watched,
                     uint64_t inputs, uint64_t outputs) {
  see(op, r);
  if (watched && !watched_seen_) {
    watched_seen_ = true;
    uint32_t next = 1;
    for (size_t i = 0; i < op.input_tensors.size() && i < 64 && next; ++i)
      if (inputs >> i & 1) {
        watched_inputs_.push_back({op.input_tensors[i], next});
        taint_[op.input_tensors[i]] |= next;
        next <<= 1;
      }
    for (size_t i = 0; i < op.output_tensors.size() && i < 64 && next; ++i)
      if (outputs >> i & 1) {
        watched_outputs_.push_back({op.output_tensors[i], next});
        next <<= 1;
      }
    spread(op, /*watched=*/true);
    // Its differing outputs reach what this op writes, and what reads them from here on.
    for (const Watched& w : watched_outputs_) {
      taint_[w.id] |= w.bit;
      if (writes_training_state(op)) reached_ |= w.bit;
    }
    return;
  }
  if (watched_seen_) spread(op, /*watched=*/false);
}

TensorRole RoleTracker::role_of(int64_t id, bool reaches) const {
  const Fact* f = fact(base_of(id));
  if (!f) return TensorRole::kUnknown;
  const bool forward = f->readers & kReadForward, backward = f->readers & kReadBackward,
             optimizer = f->readers & kReadOptimizer;
  switch (f->maker) {
    case kRandom: return TensorRole::kRandomDraw;
    case kOptimizer:
      if (forward) return TensorRole::kParameter;
      if (backward) return TensorRole::kGradient;
      // Never read again (the last step's update): a parameter when its maker read one.
      if (!optimizer && f->maker_read_parameter_candidate) return TensorRole::kParameter;
      return TensorRole::kOptimizerState;
    case kBackward: return TensorRole::kGradient;
    case kForwardWrittenArgument:
    case kForward:
      if (f->scaler_scale) return TensorRole::kHyperparameter;
      // Gradients reworked outside the passes: unscaled (GradScaler), clipped.
      if (f->maker_read_gradient && (optimizer || backward)) return TensorRole::kGradient;
      if (f->maker == kForwardWrittenArgument) return TensorRole::kModelBuffer;
      if (optimizer && !forward && !backward && !f->maker_read_gradient)
        return TensorRole::kHyperparameter;
      if (reaches) return TensorRole::kActivation;
      return f->made_grad_off ? TensorRole::kEvaluation : TensorRole::kOutsideTraining;
    case kUnseen:
    case kExternal:
      if (forward && optimizer) return TensorRole::kParameter;
      if (optimizer) return backward ? TensorRole::kGradient : TensorRole::kOptimizerState;
      if (forward && reaches) return TensorRole::kBatch;
      // Read only with autograd off: an evaluation's batch.
      if (forward)
        return f->readers & kReadForwardGradOn ? TensorRole::kOutsideTraining
                                               : TensorRole::kEvaluation;
      return TensorRole::kUnknown;
    default: return TensorRole::kUnknown;
  }
}

std::vector<RoleTracker::Answer> RoleTracker::answers(const std::vector<Watched>& watched) const {
  std::vector<Answer> out;
  for (const Watched& w : watched) {
    const Fact* f = fact(base_of(w.id));
    // Read by the backward pass or the optimizer anywhere: it is what training reads.
    const bool read_by_training = f && (f->readers & (kReadBackward | kReadOptimizer));
    Answer a;
    a.reaches_training = (reached_ & w.bit) || read_by_training;
    a.role = role_of(w.id, a.reaches_training);
    out.push_back(a);
  }
  return out;
}

Status find_roles(const std::string& path_a, FirstDivergence* fd) {
  uint64_t inputs = 0, outputs = 0;
  for (const TensorPair& p : fd->evidence.inputs)
    if (p.differs && p.index < 64) inputs |= uint64_t(1) << p.index;
  for (const TensorPair& p : fd->evidence.outputs)
    if (p.differs && p.index < 64) outputs |= uint64_t(1) << p.index;
  trace::TraceReader r;
  if (Status s = r.open(path_a); !s.ok()) return s;
  RoleTracker roles;
  while (r.next() == trace::ReadResult::kRecord)
    if (r.kind() == trace::RecordKind::kOp)
      roles.op(r.op(), r, r.op().offset == fd->offset_a, inputs, outputs);
  if (!roles.watched()) return Status();
  const auto in = roles.inputs(), out = roles.outputs();
  size_t k = 0;
  fd->evidence.training.known = true;
  for (TensorPair& p : fd->evidence.inputs)
    if (p.differs && p.index < 64 && k < in.size()) {
      p.tensor_role = in[k].role;
      fd->evidence.training.reaches |= in[k++].reaches_training;
    }
  k = 0;
  for (TensorPair& p : fd->evidence.outputs)
    if (p.differs && p.index < 64 && k < out.size()) {
      p.tensor_role = out[k].role;
      fd->evidence.training.reaches |= out[k++].reaches_training;
    }
  return Status();
}

}  // namespace detaudit
