#include "stream/pending_records.h"

#include <algorithm>

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
    desc->bits = uint8_t(
        (desc->bits | trace::kTensorNotRead) &
        ~(trace::kTensorHasStats | trace::kTensorHasNanInf | trace::kTensorIntStats));
    return;
  }
  if (md5_)
    md5_result_.fill(desc);
  else
    lane_result_to_desc(result_, dtype_, with_stats_, desc);
}

PendingRecords::Entry& PendingRecords::push() {
  if (count_ == ring_.size()) {
    // Full: a larger ring, the entries in use first and in order.
    std::vector<Entry> grown(std::max<size_t>(8, ring_.size() * 2));
    for (size_t i = 0; i < count_; ++i) grown[i] = std::move(ring_[(head_ + i) % ring_.size()]);
    ring_.swap(grown);
    head_ = 0;
  }
  Entry& e = ring_[(head_ + count_++) % ring_.size()];
  e.body.clear();
  e.holes.clear();
  e.framed = false;
  return e;
}

std::string* PendingRecords::sink(std::string* stream) {
  if (count_ == 0) return stream;
  Entry& last = ring_[(head_ + count_ - 1) % ring_.size()];
  if (last.framed) return &last.body;
  Entry& e = push();
  e.framed = true;
  return &e.body;
}

void PendingRecords::hold(std::string_view kind_and_body, std::vector<Hole>&& holes) {
  Entry& e = push();
  if (holes.empty()) {  // nothing pending after all: framed now, in its place
    e.framed = true;
    trace::frame_record(kind_and_body, &e.body);
    return;
  }
  e.body.assign(kind_and_body);
  e.holes.swap(holes);  // `holes` gets this entry's old, cleared room
}

void PendingRecords::frame_into(Entry& e, std::string* stream) {
  tensors_.clear();
  tensor_ends_.clear();
  trace::ByteWriter w(&tensors_);
  for (Hole& h : e.holes) {
    h.digest->apply(&h.desc);
    trace::write_tensor(w, h.desc, h.base_back);
    tensor_ends_.push_back(tensors_.size());
  }
  trace::ByteWriter out(stream);
  out.varint(e.body.size() + tensors_.size());
  uint32_t crc = 0;
  auto piece = [&](const char* p, size_t n) {
    stream->append(p, n);
    crc = trace::crc32c(crc, p, n);
  };
  size_t at = 0, tensor_at = 0;
  for (size_t i = 0; i < e.holes.size(); ++i) {
    piece(e.body.data() + at, e.holes[i].offset - at);
    piece(tensors_.data() + tensor_at, tensor_ends_[i] - tensor_at);
    at = e.holes[i].offset;
    tensor_at = tensor_ends_[i];
  }
  piece(e.body.data() + at, e.body.size() - at);
  out.u32(crc);
}

size_t PendingRecords::release(std::string* stream) {
  size_t released = 0;
  while (count_ > 0) {
    Entry& e = ring_[head_];
    if (e.framed) {
      stream->append(e.body);
    } else {
      for (const Hole& h : e.holes)
        if (!h.digest->done()) return released;
      frame_into(e, stream);
      e.holes.clear();  // the digests go; the room stays
    }
    head_ = (head_ + 1) % ring_.size();
    --count_;
    ++released;
  }
  return released;
}

}  // namespace detaudit::hooks
