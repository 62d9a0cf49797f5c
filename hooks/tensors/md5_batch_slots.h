// A thread's MD5 batches and the process's digest thread, torch-free: the op's thread writes
// messages into one batch while the digest thread hashes the other (digest/md5_batch.h). Each
// message's digest is pending (pending_records.h) until its batch has run.
//
//   Md5BatchSlots slots;
//   std::memcpy(slots.reserve(n), bytes, n);
//   std::shared_ptr<PendingDigest> d = slots.commit(dtype, with_stats);
//   slots.submit_if_idle();   // at a hand-over: the batch goes if the digest thread is idle
//   slots.run();              // every digest complete (the stream's end, a capture)
//
// A full batch runs at once: on the program's intra-op threads when the op's thread can use
// several (they would wait at their barrier meanwhile, spinning, and a digest thread beside them
// takes the core that one of them is needed on); else on the digest thread, and the op's thread
// waits only when it has filled the other batch before the digest thread gave the first back. Only the op's thread calls these,
// or a stop signal's save (on the writer thread) once that thread is out of its buffer for good.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "digest/md5_batch.h"
#include "stream/pending_records.h"

namespace detaudit::hooks {

// The program's intra-op threads (tensor_digest.h's on_torch_pool), as the calling thread can
// use them now.
struct IntraOpThreads {
  ParallelFor parallel;
  std::function<size_t()> available;  // 1: the caller alone (one thread, or a parallel region)
};

class Md5BatchSlots {
 public:
  explicit Md5BatchSlots(IntraOpThreads threads = {}) : threads_(std::move(threads)) {}
  // Room for the next message's n bytes (0 < n <= Md5Batch::kMaxTensorBytes), which the caller
  // writes before commit(). A message reserved and not committed is dropped by the next reserve().
  uint8_t* reserve(size_t n);
  // The reserved message, of a tensor of `dtype`: its digest and statistics, computed later.
  std::shared_ptr<PendingDigest> commit(trace::Dtype dtype, bool with_stats);
  // Runs the batch being filled if the digest thread is idle, on the intra-op threads if there
  // are several, else on the digest thread; never waits for the digest thread.
  void submit_if_idle();
  // Completes every pending digest: waits for the batch in flight, runs the other here. For a
  // stop signal's save, waits at most `max_wait_ms` for the digest thread, and returns false
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
  // Runs s here, over the intra-op threads; false if there is one only.
  bool run_on_intra_op_threads(Slot& s);

  IntraOpThreads threads_;

  Slot slots_[2];
  int filling_ = 0;  // never busy
};

// A line for the .status file ("" when no batch ran): runs and messages, and how many batches
// ran on the digest thread, over the process.
std::string md5_batch_status();
// A forked child's counters start from zero: the parent's runs are not its own.
void forget_md5_batch_status();

}  // namespace detaudit::hooks
