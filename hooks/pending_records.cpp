#include "pending_records.h"

#include "digest/device_digest.h"
#include "trace/records.h"

namespace detaudit::hooks {

void PendingDigest::complete(const lanes::LaneResult* result) {
  if (result)
    result_ = *result;
  else
    failed_ = true;
  done_.store(true, std::memory_order_release);
}

void PendingDigest::complete(const Md5Batch::Result& result) {
  md5_result_ = result;
  md5_ = true;
  done_.store(true, std::memory_order_release);
}

void PendingDigest::apply(trace::TensorDesc* desc) const {
  if (failed_) {
    desc->digest.fill(0);
    desc->bits = uint8_t((desc->bits | trace::kTensorNotRead) &
                         ~(trace::kTensorHasStats | trace::kTensorHasNanInf | trace::kTensorIntStats));
    return;
  }
  if (md5_)
    md5_result_.fill(desc);
  else
    lane_result_to_desc(result_, dtype_, with_stats_, desc);
}

void PendingRecords::hold(std::string kind_and_body, std::vector<Hole> holes) {
  Entry e;
  e.body = std::move(kind_and_body);
  e.holes = std::move(holes);
  if (e.holes.empty()) {  // nothing pending after all: framed now, in its place
    std::string framed;
    trace::frame_record(e.body, &framed);
    e.body.swap(framed);
  }
  entries_.push_back(std::move(e));
}

size_t PendingRecords::release(std::string* stream) {
  size_t released = 0;
  while (!entries_.empty()) {
    Entry& e = entries_.front();
    if (e.holes.empty()) {
      stream->append(e.body);
    } else {
      for (const Hole& h : e.holes)
        if (!h.digest->done()) return released;
      std::string body;
      size_t at = 0;
      trace::ByteWriter w(&body);
      for (Hole& h : e.holes) {
        body.append(e.body, at, h.offset - at);
        h.digest->apply(&h.desc);
        trace::write_tensor(w, h.desc, h.base_back);
        at = h.offset;
      }
      body.append(e.body, at, std::string::npos);
      trace::frame_record(body, stream);
    }
    entries_.pop_front();
    ++released;
  }
  return released;
}

}  // namespace detaudit::hooks
