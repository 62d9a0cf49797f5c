#include "collectives/received_buffers.h"

#include <ATen/record_function.h>

#include "digest/digest.h"
#include "tensors/tensor_cache.h"
#include "tensors/tensor_digest.h"

namespace detaudit::hooks {

ReceivedBuffers::ReceivedBuffers(std::vector<at::Tensor> tensors, trace::DigestAlgo algo,
                                 bool stats)
    : tensors_(std::move(tensors)), algo_(algo), stats_(stats) {}

void ReceivedBuffers::describe_once(bool failed) {
  std::unique_lock<std::mutex> lock(mu_);
  if (claimed_) {
    done_.wait(lock, [&] { return described(); });
    return;
  }
  claimed_ = true;
  lock.unlock();

  // Either thread may get here; neither runs an op the program could see.
  std::vector<Described> out(tensors_.size());
  size_t i = failed ? tensors_.size() : 0;
  failed_ = failed;
  try {
    at::RecordFunctionGuard no_recording(false);
    Hasher hasher(algo_);
    for (; i < tensors_.size(); ++i) {
      const at::Tensor& t = tensors_[i];
      if ((out[i].skipped = unhashable_reason(t))) continue;
      out[i].version = tensor_version(t);
      out[i].bytes = describe_tensor(t, &hasher, stats_, &out[i].desc);
    }
  } catch (const std::exception&) {
    // Never throw into the thread completing the future: what is left reads as unhashable.
    for (; i < tensors_.size(); ++i) out[i].skipped = "not readable when the collective completed";
  }

  lock.lock();
  descriptions_ = std::move(out);
  described_.store(true, std::memory_order_release);
  lock.unlock();
  done_.notify_all();
}

}  // namespace detaudit::hooks
