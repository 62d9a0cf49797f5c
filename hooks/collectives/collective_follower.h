// The collectives one thread issued, followed from their op's start to their Work's completion:
// the receive buffers named when the op starts, handed to the thread that completes the Work's
// future when the op returns (received_buffers.h), and given back, described, for the
// COLLECTIVE record the thread writes at its next op after that (hooks/recorder).
//
// Invariant: collectives do not nest on a thread; one starts at a time.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/received_buffers.h"
#include "trace/format.h"

namespace detaudit::hooks {

class CollectiveFollower {
 public:
  struct Pending {
    trace::CollectiveInfo info;
    std::vector<at::Tensor> received;  // until the op returns; then in `buffers`
    c10::intrusive_ptr<c10::ivalue::Object> work;
    c10::intrusive_ptr<c10::ivalue::Future> future;  // the Work's, if it has one
    std::shared_ptr<ReceivedBuffers> buffers;
    // Described, or described now: the future (else the Work) completed.
    bool ready();
  };

  // A collective op starts with `inputs` on `group`, numbered in `info`: its receive buffers are
  // followed. Returns the arguments it overwrites rather than reads: `overwritten`, and a
  // broadcast's buffer on every rank but the root.
  uint64_t start(c10::ArrayRef<const c10::IValue> inputs, const CollectiveShape& shape,
                 const GroupView& group, uint64_t overwritten, const trace::CollectiveInfo& info);
  // The collective whose op is running, if any.
  Pending* starting() { return starting_ ? &*starting_ : nullptr; }
  // Its op was not recorded after all.
  void cancel() { starting_.reset(); }
  // Its op returned with `outputs`: its buffers go to the thread that completes its Work's
  // future, described there with `algo` (and statistics if `stats`).
  void returned(const std::vector<c10::IValue>& outputs, trace::DigestAlgo algo, bool stats);

  // Whether t's bytes are a buffer a collective in flight is still filling. A functional
  // collective (_c10d_functional::all_reduce) returns the buffer its inner c10d op fills later,
  // and wait_tensor takes it before it is filled: neither reads it.
  bool unfilled_buffer(const at::Tensor& t) {
    return !pending_.empty() && unfilled_buffer_in_flight(t);
  }
  // Whether v is, or lists, such a buffer.
  bool returns_unfilled_buffer(const c10::IValue& v) {
    return !pending_.empty() && unfilled_value_in_flight(v);
  }

  bool any_pending() const { return !pending_.empty(); }
  // Whether a COLLECTIVE record is due: one completed, or `at_end` (all of them).
  bool any_due(bool at_end);
  // The collectives due, in the order they were issued, their state set (completed, failed, or
  // not completed at the end), taken out; the others are kept.
  std::vector<Pending> take_due(bool at_end);

  // In a forked child: the parent's collectives are not this process's.
  void clear();

 private:
  bool unfilled_buffer_in_flight(const at::Tensor& t);
  bool unfilled_value_in_flight(const c10::IValue& v);

  std::optional<Pending> starting_;
  std::vector<Pending> pending_;
};

}  // namespace detaudit::hooks
