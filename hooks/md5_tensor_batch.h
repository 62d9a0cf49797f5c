// A thread's small CPU tensors, digested with MD5 many at a time (digest/md5_batch.h). Each
// tensor is copied into the batch when the op reaches it; its digest is pending until the batch
// runs, and the records that name it wait for it (pending_records.h), as they wait for a device
// digest. The batch runs when it is full, when a digest is wanted now (a capture, the stream's
// end, a stop signal) and before each hand-over to the writer, so records wait little.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "digest/md5_batch.h"
#include "pending_records.h"

namespace detaudit::hooks {

class Md5TensorBatch {
 public:
  // Whether t's bytes go through a batch: a CPU tensor of plain bits (no lazy conjugate or
  // negation), of one leaf at most, laid out so that its elements can be gathered.
  static bool takes(const at::Tensor& t);
  // t's digest and statistics, computed by a later run(); t may change or go meanwhile.
  std::shared_ptr<PendingDigest> add(const at::Tensor& t, bool with_stats);
  // Completes every pending digest.
  void run();
  bool empty() const { return pending_.empty(); }
  // A forked child: the digests belong to the parent's records.
  void discard();

 private:
  Md5Batch batch_;
  std::vector<std::shared_ptr<PendingDigest>> pending_;
};

// A line for the .status file ("" when no batch ran): runs and tensors, over the process.
std::string md5_batch_status();

}  // namespace detaudit::hooks
