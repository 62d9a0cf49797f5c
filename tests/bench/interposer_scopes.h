// The bench's floors take a global callback shaped like the interposer's op callback
// (hooks/attach.cpp): every op's inputs and outputs, in the same five scopes, so that libtorch
// spends under them what it spends under the interposer.
#pragma once

#include <ATen/record_function.h>

namespace detaudit::bench {

inline void add_callback_like_the_interposer(at::RecordFunctionCallback::StartCallback start,
                                             at::RecordFunctionCallback::EndCallback end) {
  at::addGlobalCallback(at::RecordFunctionCallback(start, end)
                            .needsInputs(true)
                            .needsOutputs(true)
                            .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                                     at::RecordScope::TORCHSCRIPT_FUNCTION,
                                     at::RecordScope::CUSTOM_CLASS, at::RecordScope::USER_SCOPE}));
}

}  // namespace detaudit::bench
