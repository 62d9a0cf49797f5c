// A collective's receive buffers, described once: the moment its Work's future completed, before
// the program can touch them.
//
// Described later, they held what the program wrote next. DDP waits on the future, copies its
// bucket out and writes the next gradients into it, while the Work still reads "not completed"
// (gloo completes the future first): a deterministic DDP program was reported divergent.
//
// Two threads race to describe them; the first wins and the other waits until it is done:
// - the thread that completes the future, in a callback the recorder adds when the op returns,
//   before the program can add its own (a comm hook's `then` that rescales the buffer runs after);
// - the thread that issued the collective, at the start of its next op once the future reads
//   completed: a future's waiter wakes before the future's callbacks run.
// Writes outside any op (NumPy) right after waiting on the future itself, not on the Work, can
// still come first: nothing runs between the wake-up and them.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "trace/format.h"
#include "trace/records.h"

namespace detaudit::hooks {

class ReceivedBuffers {
 public:
  struct Described {
    trace::TensorDesc desc;
    uint32_t version = 0;           // the tensor's version when described
    const char* skipped = nullptr;  // why it could not be hashed, if it could not
    uint64_t bytes = 0;             // bytes hashed
  };

  ReceivedBuffers(std::vector<at::Tensor> tensors, trace::DigestAlgo algo, bool stats);

  // Describes every buffer now, or waits for the thread that is; at most once. `failed`: the
  // collective's future completed with an error, so the buffers hold what it left (nothing read).
  void describe_once(bool failed = false);
  bool described() const { return described_.load(std::memory_order_acquire); }
  bool failed() const { return failed_; }  // after described()

  const std::vector<at::Tensor>& tensors() const { return tensors_; }
  // After describe_once().
  const std::vector<Described>& descriptions() const { return descriptions_; }

 private:
  const std::vector<at::Tensor> tensors_;
  const trace::DigestAlgo algo_;
  const bool stats_;
  std::vector<Described> descriptions_;
  std::mutex mu_;
  std::condition_variable done_;
  bool claimed_ = false;                // a thread is describing them, or has
  bool failed_ = false;                 // set before described_
  std::atomic<bool> described_{false};  // set under mu_, read without it
};

}  // namespace detaudit::hooks
