// Record bodies as structs, and the encoder that frames them (see format.h for the grammar).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "trace/bytes.h"
#include "trace/format.h"

namespace detaudit::trace {

struct StreamHeader {
  uint32_t version = kFormatVersion;
  DigestAlgo algo = DigestAlgo::kMd5;
  int64_t rank = 0;
  uint64_t pid = 0;
  std::string process_role = "main";  // "main", or "main.0" for its first forked child, ...
  std::string thread = "main";        // the thread's identity in its process (run_layout.h)
  uint64_t flags = 0;                 // kStream* below
  uint64_t unix_ns = 0;
};

// The stream is a DataLoader worker's: its steps are those of the batches it made.
inline constexpr uint64_t kStreamDataLoaderWorker = 1;

struct StepInfo {
  uint64_t step = 0;
  uint64_t order = 0;  // program order of the first op of the step
  uint64_t rng_cpu = 0;
  uint64_t rng_cuda = 0;
  // NumPy's global generator (numpy.random.get_state()) and Python's (random.getstate()), as
  // the optimizer step before this step ended: noted by detaudit's Python hooks (torch 2.x);
  // 0 where unknown (no step before, no NumPy imported, a C++ program).
  uint64_t rng_numpy = 0;
  uint64_t rng_python = 0;
  uint64_t intra_op_threads = 0;
  uint32_t determinism_bits = 0;
};

// A collective's place in its process group; its received tensors travel as values.
struct CollectiveInfo {
  uint64_t op_order = 0;
  uint64_t group = 0;
  uint64_t seq = 0;
  int64_t group_rank = 0;
  uint64_t group_size = 0;
  uint8_t state = kCollectiveCompleted;
};

// The head of an OP record, before its values (docs/trace-format.md, "OP body").
struct OpHead {
  uint64_t order = 0;
  uint64_t previous_order =
      0;  // of the stream's last OP record: the order is written as the change
  uint32_t name_id = 0;
  uint8_t bits = 0;  // phase, scope and the kOp* flags
  uint32_t depth = 0;
  bool grad_off = false;  // autograd was off: torch.no_grad, inference_mode
  int64_t seq_nr = -1;    // written if bits has kOpHasSeqNr
  uint64_t rng = 0;       // written if bits has kOpHasRng
};

struct EndInfo {
  uint64_t ops = 0;
  uint64_t tensors_hashed = 0;
  uint64_t bytes_hashed = 0;
  // A stream a signal ended (format 7): the signal, kEnd* bits, and the op its thread was inside
  // when kEndInsideOp is set. 0 for a stream that ended at exit.
  int signal = 0;
  uint64_t ending_bits = 0;
  std::string open_op;
};

// ending-bits of an END record a signal wrote.
inline constexpr uint64_t kEndExiting = 1;      // the process was already exiting (finalizing)
inline constexpr uint64_t kEndInsideOp = 2;     // its thread was inside open-op, never finished
inline constexpr uint64_t kEndThreadKnown = 4;  // the signal stopped this thread: whether an op
                                                // was open is known (else only "not saved open")

// A sentinel's record of an optimizer step, named after its mark: its inputs are what the step
// read from before it (the gradients), its outputs what it leaves (parameters and state).
inline bool is_step_state_record(std::string_view op_name) {
  return op_name.substr(0, 15) == "Optimizer.step#" || op_name == "detaudit::optimizer";
}

// The label detaudit's Python hooks open inside each optimizer step
// (hooks/python/detaudit_optimizer_steps.py), a user scope:
// "detaudit::optimizer_step <ordinal> <class> <tensors>": the optimizer's place among the
// program's optimizers by first step (1-based), its class, its parameter tensors.
inline constexpr std::string_view kOptimizerStepLabel = "detaudit::optimizer_step ";
struct OptimizerStepLabel {
  uint64_t ordinal = 0;
  std::string optimizer;  // "Adam"
  uint64_t tensors = 0;
};
// The label in a scope path ("train/detaudit::optimizer_step 1 Adam 7"), if it holds one.
std::optional<OptimizerStepLabel> find_optimizer_step_label(std::string_view scope_path);
// The path without that label: what the user's own scopes were.
std::string without_optimizer_step_label(std::string_view scope_path);

// The most bytes encode_end() writes.
inline constexpr size_t kMaxEndRecordBytes = 256;

// Builds one record body in a scratch buffer, then frames it onto an output buffer.
class RecordEncoder {
 public:
  ByteWriter& begin(RecordKind kind) {
    scratch_.clear();
    scratch_.push_back(char(kind));
    return writer_;
  }
  void finish(std::string* out);
  // The record begun so far: its kind byte and body.
  const std::string& scratch() const { return scratch_; }

  void header(const StreamHeader& h, std::string* out);
  void string(std::string_view s, std::string* out);
  void step(const StepInfo& s, std::string* out);
  void scope(uint32_t path, std::string* out);
  // Begins an OP record with its head; the caller writes its inputs, outputs and written
  // section, then finish().
  ByteWriter& begin_op(const OpHead& head);
  // Begins a COLLECTIVE record; the caller writes <n> <value>{n}, then finish().
  ByteWriter& begin_collective(const CollectiveInfo& c);
  void end(const EndInfo& e, std::string* out);

 private:
  std::string scratch_;
  ByteWriter writer_{&scratch_};
};

// The END record of `e`, framed, into buf (kMaxEndRecordBytes): no allocation, for a signal's
// save. open_op is cut to fit. Returns the bytes written.
size_t encode_end(const EndInfo& e, char* buf);

// Frames a record (its kind byte and body) into out: length, the bytes, their CRC-32C.
void frame_record(std::string_view kind_and_body, std::string* out);

// Writes the <tensor> production of a TENSOR_NEW value (without its type byte).
void write_tensor(ByteWriter& w, const TensorDesc& t, uint64_t base_back);

}  // namespace detaudit::trace
