// What the Python interpreter hosting the program knows and libtorch does not: a thread's name,
// and which DataLoader batch a worker process is making. Reached through Python's C API by
// dlsym, so the interposer still loads into C++ programs; every call takes the GIL briefly and
// answers nullopt when there is no interpreter, it is finalizing, or the thread is not Python's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace detaudit::hooks::python {

bool host_is_python();

// The interpreter is finalizing or gone: the program's own code has finished. Takes no lock.
bool exiting();

// threading.current_thread().name of a thread Python started; nullopt for other threads
// (autograd's, OpenMP's), which Python would only name "Dummy-<n>" in order of first call.
std::optional<std::string> thread_name();

// In a DataLoader worker process: the index of the batch its loop is making (`idx` of
// torch.utils.data._utils.worker._worker_loop), -1 before the first, and which epoch's it is
// (its fetcher's address: a persistent worker makes a fetcher each epoch); nullopt outside a
// worker.
struct WorkerBatch {
  int64_t index = -1;
  uintptr_t epoch = 0;
};
std::optional<WorkerBatch> dataloader_batch();

// In a torch.multiprocessing.spawn child: its process index (`i` of
// torch.multiprocessing.spawn._wrap), which mp.spawn programs pass on as their rank.
std::optional<int64_t> spawn_index();

}  // namespace detaudit::hooks::python
