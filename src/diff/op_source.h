// One side of a stream comparison: a trace reader with a bounded look-ahead buffer of ops and
// their alignment keys (name + phase + depth + tensor shapes and dtypes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trace/reader.h"

namespace detaudit {

struct BufferedOp {
  uint64_t key = 0;
  uint64_t index = 0;  // position among the stream's ops
  trace::OpRecord rec;
};

class OpSource {
 public:
  // The look-ahead is bounded by ops and by tensor ids, so buffered ops' tensors stay in the
  // reader's reference window.
  static constexpr size_t kCapacity = 2048;

  explicit OpSource(trace::TraceReader* reader);

  // Buffers up to n ops; returns how many are buffered (fewer at the end of the stream).
  size_t fill(size_t n);
  size_t size() const { return count_; }
  BufferedOp& at(size_t i) { return ring_[(head_ + i) % kCapacity]; }
  const BufferedOp& at(size_t i) const { return ring_[(head_ + i) % kCapacity]; }
  void pop(size_t n = 1);

  // True once the reader stopped: end of file, cut short or corrupt.
  bool exhausted() const { return stopped_; }
  trace::ReadResult stop_result() const { return stop_result_; }
  trace::TraceReader& reader() { return *reader_; }
  const trace::TraceReader& reader() const { return *reader_; }
  uint64_t ops_read() const { return ops_read_; }
  uint64_t records_read() const { return records_; }
  std::string_view name_of(const trace::OpRecord& op) const { return reader_->string(op.name); }
  const trace::StepInfo* step_info(uint64_t step) const;

 private:
  bool read_one();
  uint64_t key_of(const trace::OpRecord& op);

  trace::TraceReader* reader_;
  std::vector<BufferedOp> ring_;
  size_t head_ = 0, count_ = 0;
  bool stopped_ = false;
  trace::ReadResult stop_result_ = trace::ReadResult::kRecord;
  uint64_t ops_read_ = 0, records_ = 0;
  std::vector<uint64_t> name_hash_;  // by string id
  std::vector<int64_t> first_tensor_;  // tensors_seen() when each buffered op was read
};

}  // namespace detaudit
