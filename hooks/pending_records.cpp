#include "pending_records.h"

#include "trace/records.h"

namespace detaudit::hooks {

std::vector<PendingRecords::Hole*> PendingRecords::hold(std::string kind_and_body,
                                                         std::vector<std::unique_ptr<Hole>> holes) {
  std::vector<Hole*> out;
  for (auto& h : holes) out.push_back(h.get());
  Entry e;
  e.body = std::move(kind_and_body);
  e.holes = std::move(holes);
  if (e.holes.empty()) {  // nothing pending after all: framed now, in its place
    std::string framed;
    trace::frame_record(e.body, &framed);
    e.body.swap(framed);
  }
  entries_.push_back(std::move(e));
  return out;
}

size_t PendingRecords::release(std::string* stream) {
  size_t released = 0;
  while (!entries_.empty()) {
    Entry& e = entries_.front();
    if (e.holes.empty()) {
      stream->append(e.body);
    } else {
      for (const auto& h : e.holes)
        if (!h->filled.load(std::memory_order_acquire)) return released;
      std::string body;
      size_t at = 0;
      trace::ByteWriter w(&body);
      for (const auto& h : e.holes) {
        body.append(e.body, at, h->offset - at);
        trace::write_tensor(w, h->desc, h->base_back);
        at = h->offset;
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
