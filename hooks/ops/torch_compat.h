// Where libtorch versions differ, for the interposer: one place, so the recorder reads the same
// against Debian's libtorch 1.13 and pip's torch 2.x (the supported range, tested at both ends).
//
// API differences handled here:
// - RecordFunction::operator_name() returns c10::optional in 1.13 and std::optional in 2.x
//   (c10::optional became an alias, and newer headers drop it): OptionalOperatorName.
// - TORCH_VERSION_MAJOR/MINOR exist in both (torch/version.h): DETAUDIT_TORCH_AT_LEAST.
// - torch 2.14's headers are C++20: hooks/CMakeLists.txt builds against them as C++20.
// - A CUDA wheel needs the system's nvcc and the wheel's own nvrtc to configure (same file).
//
// Behaviour that differs and is handled where it matters, named here so it is found:
// - Optimizers: 2.x LBFGS runs no op between back-to-back step() calls, so a step also begins
//   at the next top-level Optimizer.step mark (ThreadRecorder::on_start).
// - Kernels call resize_ on out= buffers more often in 2.x (layer_norm backward, mse_loss): its
//   output is bytes no op wrote (returns_uninitialized in recorder.cpp).
// - Intra-op threads: pip's torch starts with one per core, Debian's with one. Not an API matter,
//   but it is why a race fires by default on 2.x; the STEP records carry the count.
// - torch.utils.data, read by name in both versions: the worker-fed iterator's profiler scope
//   "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__" (phase_tracker.cpp), the
//   worker loop `_worker_loop` and its local `idx`, and the pin-memory thread's target
//   `_pin_memory_loop` (python_state.cpp, stream_identity.cpp).
// - torch.profiler.record_function is an op pair in 2.x (profiler::_record_function_enter_new,
//   _record_function_exit) around a USER_SCOPE RecordFunction: the ops are not recorded.
// - c10d collectives (c10d::allreduce_, ...) carry no (a!) annotation in either version, and
//   1.13 registers them CompositeExplicitAutograd with unnamed arguments (_0, _1): their writes
//   cannot be read from the schema, and their buffers fill when the Work completes.
#pragma once

#include <ATen/record_function.h>
#include <torch/version.h>

#include <type_traits>
#include <utility>

#define DETAUDIT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||           \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace detaudit::hooks {

using OptionalOperatorName =
    std::decay_t<decltype(std::declval<const at::RecordFunction&>().operator_name())>;

}  // namespace detaudit::hooks
