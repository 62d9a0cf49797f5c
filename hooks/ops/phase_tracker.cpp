#include "ops/phase_tracker.h"

#include <c10/core/GradMode.h>

namespace detaudit::hooks {
namespace {
bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}
// torch.utils.data's profiler name for a worker-fed iterator's __next__ (1.13 to 2.14).
constexpr std::string_view kBatchIntakeScope =
    "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__";
}  // namespace

Mark PhaseTracker::classify(const at::RecordFunction& fn) {
  std::string_view name = fn.name();
  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    if (starts_with(name, "Optimizer.step#")) return Mark::kOptimizerStep;
    if (starts_with(name, "Optimizer.") || name == "detaudit::optimizer")
      return Mark::kOptimizerOther;
    if (name == "detaudit::step") return Mark::kStepEnd;
    if (name == "detaudit::backward") return Mark::kBackwardFrom;
    return Mark::kUserScope;
  }
  if (starts_with(name, "autograd::engine::evaluate_function")) return Mark::kBackwardNode;
  return Mark::kOp;
}

void PhaseTracker::enter(Mark mark, std::string_view name) {
  switch (mark) {
    case Mark::kOptimizerStep:
      ++optimizer_step_depth_;
      ++optimizer_depth_;
      break;
    case Mark::kOptimizerOther: ++optimizer_depth_; break;
    case Mark::kBackwardNode: ++backward_depth_; break;
    case Mark::kUserScope:
      scopes_.emplace_back(name);
      scope_path_stale_ = true;
      ++scope_changes_;
      if (name == kBatchIntakeScope) ++batch_intake_depth_;
      break;
    case Mark::kStepEnd:
    case Mark::kBackwardFrom:
    case Mark::kOp: break;
  }
}

bool PhaseTracker::leave(Mark mark) {
  switch (mark) {
    case Mark::kOptimizerStep: --optimizer_step_depth_; return --optimizer_depth_ == 0;
    case Mark::kOptimizerOther: --optimizer_depth_; return false;
    case Mark::kStepEnd: return true;
    case Mark::kBackwardNode:
      --backward_depth_;
      backward_seen_in_step_ = true;
      return false;
    case Mark::kUserScope:
      if (!scopes_.empty()) {
        if (scopes_.back() == kBatchIntakeScope) --batch_intake_depth_;
        scopes_.pop_back();
      }
      scope_path_stale_ = true;
      ++scope_changes_;
      return false;
    case Mark::kBackwardFrom:
    case Mark::kOp: return false;
  }
  return false;
}

void PhaseTracker::enter_op(bool backward) {
  ++op_depth_;
  if (backward) ++backward_depth_;
}

void PhaseTracker::leave_op(bool backward) {
  --op_depth_;
  if (backward) {
    --backward_depth_;
    backward_seen_in_step_ = true;
  }
}

trace::Phase PhaseTracker::phase(bool python_host) const {
  using trace::Phase;
  if (backward_depth_ > 0) return Phase::kBackward;
  const bool grad = c10::GradMode::is_enabled();
  // Inside Optimizer.step, grad-enabled work is a closure's forward pass (LBFGS).
  if (optimizer_step_depth_ > 0 && optimizer_step_depth_ == optimizer_depth_)
    return grad ? Phase::kForward : Phase::kOptimizer;
  if (optimizer_depth_ > 0) return Phase::kOptimizer;  // zero_grad and the like
  // C++ programs have no optimizer marks: no-grad work after a backward is the optimizer's.
  if (!python_host && backward_seen_in_step_ && !grad) return Phase::kOptimizer;
  return Phase::kForward;
}

const std::string& PhaseTracker::scope_path() {
  if (scope_path_stale_) {
    scope_path_.clear();
    for (const std::string& s : scopes_) {
      if (!scope_path_.empty()) scope_path_ += '/';
      scope_path_ += s;
    }
    scope_path_stale_ = false;
  }
  return scope_path_;
}

}  // namespace detaudit::hooks
