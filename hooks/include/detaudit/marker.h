// Step and phase markers for C++ libtorch programs; header-only, no link dependency.
//
// Python programs need none: detaudit reads the `Optimizer.step#...` marks PyTorch's optimizers
// emit. A C++ loop marks each step with one line:
//
//   for (int step = 0; step < steps; ++step) {
//     DETAUDIT_STEP();                  // the step ends when this scope ends
//     auto loss = model->forward(x) ...;
//     { DETAUDIT_BACKWARD(loss); loss.backward(); }
//     { DETAUDIT_OPTIMIZER(); optimizer.step(); }
//   }
//
// Without markers the whole process is step 0. DETAUDIT_BACKWARD is optional: with it and
// DETAUDIT_OPTIMIZER, `run --sentinel` takes the loss from the mark and sees no other op outside
// the optimizer, at about plain speed (Python programs get it without a line). The marks are
// RecordFunction user scopes: they cost nothing unless a RecordFunction callback (detaudit's, or
// a profiler) is registered.
#pragma once

#include <ATen/record_function.h>

namespace detaudit {

// Marks the enclosing scope as one training step.
class StepGuard {
 public:
  StepGuard() : guard_(at::RecordScope::USER_SCOPE) {
    if (guard_.isActive()) guard_.before("detaudit::step");
  }

 private:
  at::RecordFunction guard_;
};

// Marks the enclosing scope as the optimizer phase.
class OptimizerGuard {
 public:
  OptimizerGuard() : guard_(at::RecordScope::USER_SCOPE) {
    if (guard_.isActive()) guard_.before("detaudit::optimizer");
  }

 private:
  at::RecordFunction guard_;
};

// Marks the backward pass from `loss`, which the mark carries as its input.
class BackwardGuard {
 public:
  explicit BackwardGuard(const at::Tensor& loss)
      : loss_(loss), guard_(at::RecordScope::USER_SCOPE) {
    if (!guard_.isActive()) return;
    if (guard_.needsInputs())
      guard_.before("detaudit::backward", c10::ArrayRef<const c10::IValue>(&loss_, 1));
    else
      guard_.before("detaudit::backward");
  }

 private:
  c10::IValue loss_;  // the RecordFunction refers to it until it ends: declared first
  at::RecordFunction guard_;
};

}  // namespace detaudit

#define DETAUDIT_CONCAT_(a, b) a##b
#define DETAUDIT_CONCAT(a, b) DETAUDIT_CONCAT_(a, b)
#define DETAUDIT_STEP() ::detaudit::StepGuard DETAUDIT_CONCAT(detaudit_step_, __LINE__)
#define DETAUDIT_BACKWARD(loss) \
  ::detaudit::BackwardGuard DETAUDIT_CONCAT(detaudit_backward_, __LINE__)(loss)
#define DETAUDIT_OPTIMIZER() \
  ::detaudit::OptimizerGuard DETAUDIT_CONCAT(detaudit_optimizer_, __LINE__)
