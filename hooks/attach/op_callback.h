// hooks/attach: the interposer's entry point: loaded into the process, it registers the callbacks
// and the safety nets at exit, at _exit, at fork and on signals.
//
// The shape of the interposer's op callback: every op's inputs and outputs, in the scopes a
// training program's ops and marks run in. Not the mobile, static-runtime and build-feature
// ones: the autograd engine rebuilds libtorch's callback list of every scope a callback takes,
// on every task it runs. attach.cpp adds the interposer's with it, and the bench's floors
// (tests/bench/) theirs, so that they measure what libtorch spends under the interposer.
#pragma once

#include <ATen/record_function.h>

namespace detaudit::hooks {

inline at::RecordFunctionCallback op_callback(at::RecordFunctionCallback::StartCallback start,
                                              at::RecordFunctionCallback::EndCallback end) {
  return at::RecordFunctionCallback(start, end)
      .needsInputs(true)
      .needsOutputs(true)
      .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
               at::RecordScope::TORCHSCRIPT_FUNCTION, at::RecordScope::CUSTOM_CLASS,
               at::RecordScope::USER_SCOPE});
}

}  // namespace detaudit::hooks
