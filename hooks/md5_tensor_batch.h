// A thread's small CPU tensors, digested with MD5 many at a time (digest/md5_batch.h), on a
// thread of their own. Each tensor is copied into the batch being filled when the op reaches it;
// its digest is pending until the digest thread has run that batch, and the records that name it
// wait for it (pending_records.h), as they wait for a device digest. The op's thread only copies:
// MD5 of a small-op model's tensors costs as much as the ops themselves, and here it runs beside
// them. Two batches per thread: one filled, one hashed. A full batch goes to the digest thread;
// at a hand-over the batch goes too if that thread is idle; when a digest is wanted now (a
// capture, the stream's end, a stop signal) the thread waits for the one in flight and runs the
// other itself.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
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
  // t's digest and statistics, computed later; t may change or go meanwhile.
  std::shared_ptr<PendingDigest> add(const at::Tensor& t, bool with_stats);
  // Hands the batch being filled to the digest thread if that thread is idle; never waits.
  void submit_if_idle();
  // Completes every pending digest: waits for the batch in flight, runs the other here. From a
  // stop signal's handler, waits at most `max_wait_ms` for the digest thread, and returns false
  // if it did not finish (its digests stay pending).
  bool run(long max_wait_ms = -1);
  bool empty() const { return slots_[0].pending.empty() && slots_[1].pending.empty(); }
  // A forked child: the digests belong to the parent's records, and no digest thread runs here.
  void discard();

  // One batch and the digests it completes. The digest thread touches only a slot whose `busy`
  // it was given, and only until it clears it.
  struct Slot {
    Md5Batch batch;
    std::vector<std::shared_ptr<PendingDigest>> pending;
    std::atomic<bool> busy{false};
  };

 private:
  // Waits until `s` is back from the digest thread (at most max_wait_ms if >= 0), then forgets
  // its digests, which are complete. False on time-out.
  bool reclaim(Slot& s, long max_wait_ms = -1);
  void hand_off(Slot& s);

  Slot slots_[2];
  int filling_ = 0;
};

// A line for the .status file ("" when no batch ran): runs and tensors, and how many batches
// ran on the digest thread, over the process.
std::string md5_batch_status();

}  // namespace detaudit::hooks
