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
// A full batch goes to the digest thread at once; the op's thread waits only when it has filled
// the other batch before the digest thread gave the first back. Only the op's thread calls these,
// or a stop signal's save (on the writer thread) once that thread is out of its buffer for good.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "digest/md5_batch.h"
#include "stream/pending_records.h"

namespace detaudit::hooks {

class Md5BatchSlots {
 public:
  // Room for the next message's n bytes (0 < n <= Md5Batch::kMaxMessageBytes), which the caller
  // writes before commit(). A message reserved and not committed is dropped by the next reserve().
  uint8_t* reserve(size_t n);
  // The reserved message, of a tensor of `dtype`: its digest and statistics, computed later.
  std::shared_ptr<PendingDigest> commit(trace::Dtype dtype, bool with_stats);
  // Hands the batch being filled to the digest thread if that thread is idle; never waits.
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

  Slot slots_[2];
  int filling_ = 0;  // never busy
};

// A line for the .status file ("" when no batch ran): runs and messages, and how many batches
// ran on the digest thread, over the process.
std::string md5_batch_status();

}  // namespace detaudit::hooks
