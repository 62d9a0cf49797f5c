// One side of a stream comparison: a trace reader with a bounded look-ahead buffer of ops and
// their alignment keys (name + phase + depth + tensor shapes and dtypes).
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "trace/reader.h"
#include "trace/records.h"

namespace detaudit {

// The digests of an op's outputs, copied while they were hot after decoding, so the comparator
// need not reach back into the reader's tensor window for ops that match.
struct OutputDigests {
  static constexpr size_t kMax = 4;
  bool present = false;  // false: more outputs than kMax, or one left the window
  uint8_t count = 0;
  uint8_t digest_len = 0;
  uint8_t compared = 0;  // bit i: output i is compared (not uninitialized)
  uint64_t results = 0;  // OpRecord::results_hash: scalar returns are outputs too
  std::array<trace::DigestBytes, kMax> digests;

  // True when both are present and equal output by output: outputs_differ would find no
  // difference. False says nothing: compare the tensors.
  bool same_as(const OutputDigests& o) const {
    if (!present || !o.present || count != o.count || compared != o.compared ||
        digest_len != o.digest_len || results != o.results)
      return false;
    for (size_t i = 0; i < count; ++i)
      if ((compared >> i & 1) &&
          std::memcmp(digests[i].data(), o.digests[i].data(), digest_len) != 0)
        return false;
    return true;
  }
};

struct BufferedOp {
  static constexpr uint32_t kNoRegion = UINT32_MAX;
  uint64_t key = 0;
  uint64_t index = 0;  // position among the stream's ops
  // The last torch.compile region (string id) read up to this op in its step, or kNoRegion:
  // tensors of provenance "compiled" were most likely made there.
  uint32_t compiled_region = kNoRegion;
  OutputDigests outputs;
  trace::OpRecord rec;
  // A c10d collective: its outputs are its receive buffers as its COLLECTIVE record gave them,
  // once read (`received`); until then geometry only, never compared.
  bool collective = false;
  bool received = false;
  trace::CollectiveInfo coll;
};

// Called with each op as the reader meets it, whether or not it is compared.
using OpTap = std::function<void(const trace::TraceReader&, const trace::OpRecord&)>;

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
  // The distinct torch.compile regions read so far (string ids): opaque to the recorder.
  const std::vector<uint32_t>& compiled_regions() const { return compiled_regions_; }
  // Ops of torch.compile's generated kernels (inductor_kernel::<kernel>, hooks/python/).
  uint64_t compiled_kernels() const { return compiled_kernels_; }
  // Ends the stream before its first op of a later step: a DataLoader worker's batches that no
  // step consumed (prefetched when the loop stopped) depend on timing, not on the program.
  void stop_after_step(uint64_t step) { last_step_ = step; }
  // A part of the stream (a resumed process's, resume.h): its steps shifted by `step_shift` into
  // the other run's numbering; then ops before `first_step` passed over, and `skip` more (the
  // resumed process's own setup).
  void window(uint64_t first_step, uint64_t skip, uint64_t step_shift) {
    first_step_ = first_step;
    skip_ = skip;
    step_shift_ = step_shift;
  }
  void tap(OpTap tap) { tap_ = std::move(tap); }
  bool stopped_at_step_limit() const { return stopped_at_limit_; }
  // The op that returned tensor `id` uninitialized (aten::empty), if it is known: "aten::empty
  // (op #12)".
  std::string allocated_by(int64_t id) const;
  // The largest step of the ops read so far.
  uint64_t max_step() const { return max_step_; }
  // How the stream trained, as far as its phases tell: each backward pass (a run of backward
  // ops) and each optimizer op. Passes with no optimizer op and no second step: steps unseen.
  uint64_t backward_passes() const { return backward_passes_; }
  uint64_t optimizer_ops() const { return optimizer_ops_; }
  // The optimizer whose step a step's optimizer ops ran in, by the label detaudit's Python hooks
  // open there (trace/records.h), if one was read.
  const trace::OptimizerStepLabel* optimizer_of_step(uint64_t step) const {
    auto it = step_optimizers_.find(step);
    return it == step_optimizers_.end() ? nullptr : &it->second;
  }
  // The optimizers that stepped in the steps read, by their labels' ordinals: how many, and
  // the place of one among them (1-based), which is its place in the program when every step
  // was recorded, and among an iteration's optimizers when a few steps were (--steps).
  uint64_t optimizers() const { return optimizer_ordinals_.size(); }
  uint64_t place_among_optimizers(uint64_t ordinal) const {
    return uint64_t(std::distance(optimizer_ordinals_.begin(),
                                  optimizer_ordinals_.lower_bound(ordinal))) +
           1;
  }
  // The last op read: the last to end on its thread. Valid once ops_read() > 0.
  struct LastOp {
    uint32_t name = 0;
    uint64_t step = 0, index = 0, order = 0;
  };
  const LastOp& last_op() const { return last_op_; }

 private:
  // The op whose output a tensor id is, for the empty family's (uninitialized) outputs: a read of
  // their bytes names the op that allocated them.
  struct Allocation {
    uint32_t name;
    uint64_t index;
  };
  std::unordered_map<int64_t, Allocation> allocations_;

  bool read_one();
  void note_optimizer(const trace::OpRecord& op);
  void attach(const trace::CollectiveRecord& c);
  bool is_collective(uint32_t name);
  uint64_t key_of(const trace::OpRecord& op);
  void copy_output_digests(BufferedOp* b) const;

  trace::TraceReader* reader_;
  std::vector<BufferedOp> ring_;
  size_t head_ = 0, count_ = 0;
  bool stopped_ = false;
  trace::ReadResult stop_result_ = trace::ReadResult::kRecord;
  uint64_t ops_read_ = 0, records_ = 0;
  uint64_t last_step_ = UINT64_MAX, max_step_ = 0;
  uint64_t backward_passes_ = 0, optimizer_ops_ = 0;
  bool in_backward_ = false;
  std::map<uint64_t, trace::OptimizerStepLabel> step_optimizers_;
  std::set<uint64_t> optimizer_ordinals_;
  // The scope path last parsed, its label, and the step it was last noted for.
  uint32_t label_scope_ = UINT32_MAX;
  std::optional<trace::OptimizerStepLabel> label_;
  uint64_t label_step_ = UINT64_MAX;
  uint64_t first_step_ = 0, skip_ = 0, step_shift_ = 0;
  OpTap tap_;
  LastOp last_op_;
  bool stopped_at_limit_ = false;
  std::vector<uint64_t> name_hash_;
  std::vector<int8_t> name_is_collective_;  // by string id: -1 unknown
  size_t awaiting_ =
      0;  // buffered collectives whose COLLECTIVE record is not read yet  // by string id
  std::vector<int64_t> first_tensor_;  // tensors_seen() when each buffered op was read
  uint32_t last_region_ = BufferedOp::kNoRegion;
  uint64_t last_region_step_ = 0;
  std::vector<uint32_t> compiled_regions_;
  uint64_t compiled_kernels_ = 0;
};

}  // namespace detaudit
