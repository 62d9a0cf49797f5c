// Records whose tensors are digested elsewhere (on the GPU) and finish later, kept in program
// order. A record with pending tensors is held, with everything the stream writes after it,
// until its tensors' digests are in; then it is framed and released to the stream's buffer as if
// it had been written whole. The file stays in program order and a reader sees ordinary records:
// the collective's way of completing outputs later, without a record of its own.
//
// One op thread writes and releases; the collector thread only completes digests. Torch-free.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "digest/lane_digest.h"
#include "digest/md5_batch.h"
#include "trace/format.h"

namespace detaudit::hooks {

// A tensor's digest on its way: from its device, or from a batch of small tensors' MD5s. Shared
// by every description of that tensor version (the op's record, the cache, later records that
// name the same bytes), completed once.
class PendingDigest {
 public:
  PendingDigest(trace::Dtype dtype, bool with_stats) : dtype_(dtype), with_stats_(with_stats) {}
  // The collector's thread: the result, or null when the device could not compute it.
  void complete(const lanes::LaneResult* result);
  // The digest thread (or the op's thread), from an MD5 batch.
  void complete(const Md5Batch::Result& result);
  bool done() const { return done_.load(std::memory_order_acquire); }
  // Once done(): fills desc's digest and statistics. A digest the device failed to compute
  // leaves the tensor described by its geometry, as not read: nothing is compared that was not
  // computed.
  void apply(trace::TensorDesc* desc) const;
  bool failed() const { return failed_; }

 private:
  trace::Dtype dtype_;
  bool with_stats_;
  bool failed_ = false;
  bool md5_ = false;  // md5_result_, not result_
  lanes::LaneResult result_{};
  Md5Batch::Result md5_result_;
  std::atomic<bool> done_{false};
};

class PendingRecords {
 public:
  // A tensor whose digest is filled in later: its <tensor> production goes at `offset` of the
  // record's body.
  struct Hole {
    size_t offset = 0;
    uint64_t base_back = 0;
    trace::TensorDesc desc;  // all but the digest and statistics
    std::shared_ptr<const PendingDigest> digest;
  };

  // Where the stream's next records go: `stream` itself while nothing is held, else behind the
  // last held record.
  std::string* sink(std::string* stream);
  bool empty() const { return count_ == 0; }
  size_t held() const { return count_; }

  // Holds a record: `kind_and_body` as RecordEncoder's scratch (kind byte, then the body with
  // the holes left out), and its holes, by increasing offset. `holes` is left empty, with the
  // room of a record released earlier: on the op path nothing here allocates once warm.
  void hold(std::string_view kind_and_body, std::vector<Hole>&& holes);

  // Moves the leading records whose digests are all done into `stream`, framed. Returns the
  // number of records released.
  size_t release(std::string* stream);

 private:
  struct Entry {
    std::string body;         // a held record's kind and body; or framed records written after one
    std::vector<Hole> holes;  // of a held record
    bool framed = false;
  };
  Entry& push();
  // Frames a held record whose digests are in straight onto `stream`: the holes' tensors go
  // between the body's pieces, and the CRC runs over the pieces in turn.
  void frame_into(Entry& e, std::string* stream);

  // A ring of entries that keep their buffers: `count_` of them from `head_` are in use.
  std::vector<Entry> ring_;
  size_t head_ = 0, count_ = 0;
  std::string tensors_;  // the holes' <tensor> productions, while a record is framed
  std::vector<size_t> tensor_ends_;
};

}  // namespace detaudit::hooks
