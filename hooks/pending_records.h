// Records whose tensors are digested elsewhere (on the GPU) and finish later, kept in program
// order. A record with pending tensors is held, with everything the stream writes after it,
// until its tensors are filled in; then it is framed and released to the stream's buffer as if it
// had been written whole. The file stays in program order and a reader sees ordinary records:
// the collective's way of completing outputs later, without a record of its own.
//
// One op thread writes and releases; the collector thread only fills holes. Torch-free.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "trace/format.h"

namespace detaudit::hooks {

class PendingRecords {
 public:
  // A tensor whose digest and statistics are filled in later: its <tensor> production goes at
  // `offset` of the record's body.
  struct Hole {
    size_t offset = 0;
    uint64_t base_back = 0;
    trace::TensorDesc desc;
    std::atomic<bool> filled{false};
  };

  // Where the stream's next records go: `stream` itself while nothing is held, else behind the
  // last held record.
  std::string* sink(std::string* stream) {
    if (entries_.empty()) return stream;
    if (entries_.back().holes.empty()) return &entries_.back().body;
    entries_.emplace_back();
    return &entries_.back().body;
  }
  bool empty() const { return entries_.empty(); }

  // Holds a record: `kind_and_body` as RecordEncoder's scratch (kind byte, then the body with
  // the holes left out), and the holes, by increasing offset. Returns them, for the collector.
  std::vector<Hole*> hold(std::string kind_and_body, std::vector<std::unique_ptr<Hole>> holes);

  // Marks a hole's desc complete (the collector's thread, after writing hole->desc).
  static void fill(Hole* hole) { hole->filled.store(true, std::memory_order_release); }

  // Moves the leading records whose holes are all filled into `stream`, framed. Returns the
  // number of records released.
  size_t release(std::string* stream);

 private:
  struct Entry {
    std::string body;  // a held record's kind and body; or framed records written after one
    std::vector<std::unique_ptr<Hole>> holes;  // empty: `body` is already framed bytes
  };
  std::deque<Entry> entries_;
};

}  // namespace detaudit::hooks
