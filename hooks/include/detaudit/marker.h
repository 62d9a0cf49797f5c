// Step and phase markers for C++ libtorch programs; header-only, no link dependency.
//
// Python programs need none: detaudit reads the `Optimizer.step#...` marks PyTorch's optimizers
// emit. A C++ loop marks each step with one line:
//
//   for (int step = 0; step < steps; ++step) {
//     DETAUDIT_STEP();                  // the step ends when this scope ends
//     auto loss = model->forward(x) ...;
//     loss.backward();
//     { DETAUDIT_OPTIMIZER(); optimizer.step(); }
//   }
//
// Without markers the whole process is step 0. The marks are RecordFunction user scopes: they
// cost nothing unless a RecordFunction callback (detaudit's, or a profiler) is registered.
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

}  // namespace detaudit

#define DETAUDIT_CONCAT_(a, b) a##b
#define DETAUDIT_CONCAT(a, b) DETAUDIT_CONCAT_(a, b)
#define DETAUDIT_STEP() ::detaudit::StepGuard DETAUDIT_CONCAT(detaudit_step_, __LINE__)
#define DETAUDIT_OPTIMIZER() \
  ::detaudit::OptimizerGuard DETAUDIT_CONCAT(detaudit_optimizer_, __LINE__)
