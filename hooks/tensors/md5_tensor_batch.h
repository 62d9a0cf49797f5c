// A thread's CPU tensors of a few leaves at most, digested with MD5 many at a time
// (md5_batch_slots.h). Each tensor is copied into the batch being filled when the op reaches it
// (the program may change or free it afterwards); its digest is pending until its batch has run,
// and the records that name it wait for it (pending_records.h), as they wait for a device digest.
// The op's thread only copies: MD5 of a small-op model's tensors costs as much as the ops
// themselves, and here it runs beside them.
#pragma once

#include <ATen/ATen.h>

#include <memory>

#include "stream/record_sink.h"
#include "tensors/md5_batch_slots.h"

namespace detaudit::hooks {

class Md5TensorBatch final : public AsyncDigests {
 public:
  // Full batches run on torch's intra-op threads when the op's thread can use several
  // (md5_batch_slots.h); with false, always on the digest thread.
  explicit Md5TensorBatch(bool on_intra_op_threads = true);
  // Whether t's bytes go through a batch: a CPU tensor of plain bits (no lazy conjugate or
  // negation), of Md5Batch::kMaxTensorBytes at most, laid out so that its elements can be
  // gathered.
  static bool takes(const at::Tensor& t);
  // t's digest and statistics, computed later; t may change or go meanwhile. Null when its
  // view cannot be gathered (nothing was added).
  std::shared_ptr<PendingDigest> add(const at::Tensor& t, bool with_stats);
  void submit_if_idle() override { slots_.submit_if_idle(); }
  bool run(long max_wait_ms = -1) override { return slots_.run(max_wait_ms); }
  bool empty() const override { return slots_.empty(); }
  void discard() override { slots_.discard(); }

 private:
  bool on_intra_op_threads_;
  Md5BatchSlots slots_;
};

}  // namespace detaudit::hooks
