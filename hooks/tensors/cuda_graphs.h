// CUDA graph capture (torch.cuda.graph, torch.compile's "reduce-overhead"): a captured op's
// kernels run at each replay, not when its callback runs, and replays run no callbacks at all.
// So a captured op's CUDA tensors are described by their geometry, not read, and the storages it
// wrote are rewritten unseen at every replay (no op, no version counter): their bytes are never
// taken as known from an earlier description. While a capture is underway nothing that could
// synchronize may run on the capturing thread (it would invalidate the program's capture).
#pragma once

#include <ATen/ATen.h>

namespace detaudit::hooks {

// t is on a CUDA device whose current stream is capturing a graph.
bool captured_into_cuda_graph(const at::Tensor& t);
// `stream` (a cudaStream_t) is capturing a graph. False without the device digest's build.
bool stream_capturing(void* stream);
// A captured op wrote t: every replay writes its storage again.
void note_written_by_cuda_graph(const at::Tensor& t);
// t's storage is one a captured op wrote (costs nothing before the first capture).
bool written_by_cuda_graph(const at::Tensor& t);

}  // namespace detaudit::hooks
