// A streaming reader for one trace file: constant memory, says where and why a file is bad.
//
//   TraceReader r;
//   if (Status s = r.open(path); !s.ok()) ...
//   while (r.next() == ReadResult::kRecord)
//     if (r.kind() == RecordKind::kOp) use(r.op());
//   if (r.result() == ReadResult::kCorrupt) print(r.error());  // "<file>: offset N: why"
#pragma once

#include <cstdio>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "trace/records.h"
#include "util/status.h"

namespace detaudit::trace {

enum class ReadResult {
  kRecord,     // a whole, checked record is available
  kEof,        // the file ended at a record boundary
  kTruncated,  // the file ends inside a record: the writer was killed; all before it is good
  kCorrupt,    // a bad checksum, length or body; error() names the offset
};

// One decoded value. Lists are flattened: a list value (kList, kIntList, kDoubleList,
// kBoolList) has count = n and is followed by its n elements.
struct Value {
  ValueType type = ValueType::kNone;
  int64_t tensor_id = -1;  // kTensorNew, kTensorRef, kTensorWritten
  int64_t i = 0;           // kInt, kDevice index, kString/kOther/kTensorSkipped string id
  double d = 0;            // kDouble
  uint64_t u = 0;          // kGenerator state digest, kDevice type
  uint64_t count = 0;      // list lengths
};

struct OpRecord {
  uint64_t offset = 0;  // of the record in its file
  uint64_t order = 0;   // program order within the process
  uint64_t step = 0;
  uint32_t name = 0;                 // string id
  uint32_t scope_path = UINT32_MAX;  // string id of the user scopes around it, or UINT32_MAX
  Phase phase = Phase::kForward;
  Scope scope = Scope::kFunction;
  uint8_t bits = 0;
  uint32_t depth = 0;
  bool grad_off = false;  // autograd was off (format 10 on; kGradOffFormat)
  int64_t seq_nr = -1;
  uint64_t rng = 0;
  std::vector<Value> inputs, outputs;
  // Ids in argument order, lists expanded. output_tensors holds what the op returned, then
  // what its written section holds: the arguments it wrote and did not return, after it ran.
  std::vector<int64_t> input_tensors, output_tensors;
  size_t returned_tensors = 0;  // output_tensors before the written ones
  // The written section: each argument's name (string id) and how many tensors it holds.
  struct WrittenArg {
    uint32_t name = 0;
    uint32_t tensors = 0;
    bool list = false;  // a list of tensors, else one
  };
  std::vector<WrittenArg> written_args;
  // Bit i: input_tensors[i] is written in full and not read (TENSOR_WRITTEN); the first 64.
  uint64_t written_inputs = 0;
  size_t returned_values = 0;  // outputs before the written section's values
  uint64_t args_hash = 0;      // of the non-tensor inputs, by content
  uint64_t results_hash = 0;   // of the non-tensor outputs (item()'s scalar), by content

  bool has_rng() const { return bits & kOpHasRng; }
  bool is_random() const { return bits & kOpIsRandom; }
  bool has_seq_nr() const { return bits & kOpHasSeqNr; }
  bool input_written(size_t i) const { return i < 64 && (written_inputs >> i & 1); }
  // output_tensors[i] is an argument the op wrote (the written section), not a return.
  bool output_is_written_arg(size_t i) const { return i >= returned_tensors; }
};

// A COLLECTIVE record: where the collective stands in its group, and its receive buffers as
// they were on completion (flattened values, as in OpRecord).
struct CollectiveRecord {
  CollectiveInfo info;
  std::vector<Value> values;
  std::vector<int64_t> tensors;
};

class TraceReader;

// The argument output_tensors[i] is when it is in the written section: "exp_avgs[2]" (a list's
// element) or "running_mean"; "" for what the op returned.
std::string written_argument(const OpRecord& op, const TraceReader& reader, size_t i);

class TraceReader {
 public:
  TraceReader();
  ~TraceReader();
  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;

  // Opens the file and reads its header record.
  Status open(const std::string& path);
  ReadResult next();
  // Like next(), but an OP record is decoded into *op and op() is left as it was: a caller that
  // keeps records (a look-ahead buffer) saves a copy.
  ReadResult next_into(OpRecord* op);
  ReadResult result() const { return result_; }
  const std::string& error() const { return error_; }

  RecordKind kind() const { return kind_; }
  const StreamHeader& header() const { return header_; }
  const StepInfo& step() const { return step_; }
  const OpRecord& op() const { return op_; }
  const EndInfo& end_info() const { return end_; }
  const CollectiveRecord& collective() const { return collective_; }
  bool saw_end() const { return saw_end_; }
  const std::vector<StepInfo>& steps() const { return steps_; }

  std::string_view string(uint64_t id) const;
  // A tensor by id, or nullptr once it has left the reference window.
  const TensorDesc* tensor(int64_t id) const;
  int64_t tensors_seen() const { return next_tensor_id_; }

  const std::string& path() const { return path_; }
  uint64_t offset() const { return record_offset_; }  // of the current record
  uint64_t bytes_read() const { return file_offset_; }
  uint64_t file_size() const { return file_size_; }

 private:
  bool fill(size_t need);
  ReadResult fail(ReadResult r, uint64_t offset, const std::string& why);
  ReadResult read(OpRecord* op);  // the next record; an OP record is decoded into *op
  bool decode(ByteReader& r, OpRecord* op);
  bool decode_op(ByteReader& r, OpRecord* out);
  bool decode_values(ByteReader& r, std::vector<Value>* values, std::vector<int64_t>* tensors,
                     uint64_t* args_hash, int depth);
  bool decode_tensor(ByteReader& r, TensorDesc* t);

  std::string path_;
  std::FILE* file_ = nullptr;
  uint64_t file_size_ = 0;
  std::vector<uint8_t> buf_;
  size_t buf_pos_ = 0, buf_len_ = 0;
  uint64_t file_offset_ = 0;  // offset of buf_[buf_pos_]
  uint64_t record_offset_ = 0;
  bool eof_ = false;

  ReadResult result_ = ReadResult::kRecord;
  std::string error_;
  RecordKind kind_ = RecordKind::kHeader;
  StreamHeader header_;
  StepInfo step_;
  OpRecord op_;
  EndInfo end_;
  CollectiveRecord collective_;
  bool saw_end_ = false;
  std::vector<StepInfo> steps_;
  std::vector<std::string> strings_;
  std::deque<TensorDesc> window_;  // grows up to kRefWindow; a deque keeps tensor() pointers
  int64_t next_tensor_id_ = 0;
  uint64_t last_order_ = 0;
  uint32_t scope_path_ = UINT32_MAX;
  size_t digest_len_ = 16;
};

}  // namespace detaudit::trace
