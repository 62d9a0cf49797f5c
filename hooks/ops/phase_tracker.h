// One thread's place in the training loop: which phase an op runs in (forward, backward,
// optimizer), how deep it is nested, when a step ends, and the user scopes around it.
//
// RecordFunctions are of three kinds here:
// - ops, recorded, each one level of depth;
// - marks that mean something: the autograd engine's node wrapper (backward), the optimizer's
//   `Optimizer.step#...` and `Optimizer.zero_grad#...` scopes, detaudit's own step marker, and
//   `detaudit::backward`, which carries the loss a backward starts from (hooks/python, marker.h);
// - every other user scope (`record_function("x")`, DDP's, the DataLoader's): a label. It never
//   changes depth, phase or step; ops inside it carry its path ("outer/inner").
#pragma once

#include <ATen/record_function.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "trace/format.h"

namespace detaudit::hooks {

enum class Mark : uint8_t {
  kOp,
  kBackwardNode,    // autograd::engine::evaluate_function: the backward phase
  kOptimizerStep,   // Optimizer.step#...: ends a step; a closure inside runs forward
  kOptimizerOther,  // Optimizer.zero_grad#... and detaudit::optimizer
  kStepEnd,         // detaudit::step, from C++ programs
  kBackwardFrom,    // detaudit::backward: its input is the loss
  kUserScope,       // a label
};

class PhaseTracker {
 public:
  static Mark classify(const at::RecordFunction& fn);

  // A mark's RecordFunction starts or ends. leave() returns true when it ends a step.
  void enter(Mark mark, std::string_view name);
  bool leave(Mark mark);
  // An op starts or ends; `backward`: a backward function (its scope says so).
  void enter_op(bool backward);
  void leave_op(bool backward);

  // An Optimizer.step mark outside any optimizer or backward work: back-to-back step() calls
  // (2.x LBFGS runs no op between them) must still start a new step.
  bool at_top_level_optimizer_step() const { return optimizer_depth_ == 0 && backward_depth_ == 0; }
  bool outside_optimizer() const { return optimizer_depth_ == 0; }
  // Outside backward and optimizer work: where a pending step may begin.
  bool outside_backward_and_optimizer() const {
    return backward_depth_ == 0 && optimizer_depth_ == 0;
  }
  trace::Phase phase(bool python_host) const;
  uint32_t op_depth() const { return op_depth_; }
  void new_step() { backward_seen_in_step_ = false; }

  // The user scopes around the next op, outermost first, joined with '/'; "" outside any.
  const std::string& scope_path();
  // Counts changes of the scope path, so the op path can skip re-reading it.
  uint64_t scope_changes() const { return scope_changes_; }
  // Inside a multiprocessing DataLoader's __next__: the main process takes in whatever batches
  // have arrived (rebuilding each with empty and set_), as many per call as timing allows.
  // Those ops move bytes that are compared where they are read, and traced to the worker.
  bool taking_in_batches() const { return batch_intake_depth_ > 0; }

 private:
  uint32_t op_depth_ = 0;
  int backward_depth_ = 0;
  int optimizer_depth_ = 0;       // inside any optimizer mark
  int optimizer_step_depth_ = 0;  // inside Optimizer.step, where a closure may run forward
  bool backward_seen_in_step_ = false;
  int batch_intake_depth_ = 0;
  std::vector<std::string> scopes_;
  std::string scope_path_;
  bool scope_path_stale_ = false;
  uint64_t scope_changes_ = 0;
};

}  // namespace detaudit::hooks
