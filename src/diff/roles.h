// What a tensor is to training, decided in one place from the data flow of its stream: which op
// and phase made it, which phases read it, and whether a path from it reaches a write of the
// training state. Never from an op's name or a value's shape.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "trace/reader.h"
#include "util/status.h"

namespace detaudit {

struct FirstDivergence;

enum class TensorRole : uint8_t {
  kUnknown,
  kParameter,        // read by the forward pass and by the optimizer, or written by it and read
                     // by the forward pass
  kGradient,         // made by the backward pass
  kOptimizerState,   // written and read by the optimizer only (moments, step counters)
  kModelBuffer,      // written by the forward pass into an argument it does not return
                     // (BatchNorm's running statistics)
  kHyperparameter,   // a scheduler's or a GradScaler's value: made outside the passes from no
                     // gradient and read by the optimizer alone (an LR held in a tensor), or
                     // GradScaler's scale (what aten::_amp_update_scale_ writes)
  kBatch,            // data entering the program that training reads
  kRandomDraw,       // made by an op that draws from a generator
  kActivation,       // made by the forward pass, reaching the training state
  kEvaluation,       // made or read by the forward pass with autograd off (torch.no_grad,
                     // inference_mode), reaching no training state: an evaluation's output
  kOutsideTraining,  // reaching no parameter, gradient or optimizer state, made with autograd
                     // on: a logged loss sum, a metric
};

// "parameter", "gradient", "optimizer state", ...; "" for kUnknown.
const char* tensor_role_name(TensorRole role);

// Parameters, gradients, optimizer state, model buffers and hyperparameters: what a checkpoint
// must carry and a resume must continue.
bool is_training_state(TensorRole role);

// The op writes training state: the backward pass (gradients), the optimizer (parameters and
// their state), or a forward op into an argument it does not return (a model buffer).
bool writes_training_state(const trace::OpRecord& op);

// Follows one stream op by op and answers, for the tensors of one op (the watched one), what
// each is and whether a path from it reaches a training-state write: an op of the backward or
// optimizer phase, or a forward op's write into an argument it does not return.
class RoleTracker {
 public:
  static constexpr size_t kMaxWatched = 32;
  // Tensor ids tracked; a longer stream leaves later tensors' roles unknown.
  static constexpr int64_t kMaxIds = int64_t(1) << 26;

  // Every OP record of the stream, in file order. `watched`: this is the op whose tensors are
  // asked about; its ids are input_tensors[i] for the bits of `inputs` and output_tensors[j]
  // for those of `outputs`.
  void op(const trace::OpRecord& op, const trace::TraceReader& r, bool watched = false,
          uint64_t inputs = 0, uint64_t outputs = 0);

  // After the stream's last op: the watched tensors' roles, inputs then outputs, in the order
  // of their bits; and whether each reaches the training state.
  struct Answer {
    TensorRole role = TensorRole::kUnknown;
    bool reaches_training = false;
  };
  std::vector<Answer> inputs() const { return answers(watched_inputs_); }
  std::vector<Answer> outputs() const { return answers(watched_outputs_); }
  bool watched() const { return watched_seen_; }

 private:
  // How a tensor version came to be.
  enum Maker : uint8_t {
    kUnseen,
    kExternal,  // first seen as an input: data loading, a checkpoint, Python
    kRandom,
    kForward,
    kForwardWrittenArgument,
    kBackward,
    kOptimizer,
    kOther,
  };
  enum Readers : uint8_t {
    kReadForward = 1,
    kReadBackward = 2,
    kReadOptimizer = 4,
    kReadOther = 8,
    kReadForwardGradOn = 16,  // by a forward op with autograd on
  };
  struct Fact {
    uint8_t maker = kUnseen;
    uint8_t readers = 0;
    bool maker_read_parameter_candidate = false;  // its maker also read a forward-read input
    bool made_grad_off = false;                   // its maker ran with autograd off
    bool maker_read_gradient = false;             // its maker read what the backward pass made
    bool scaler_scale = false;  // made by GradScaler's update (aten::_amp_update_scale_)
  };
  struct Watched {
    int64_t id = -1;
    uint32_t bit = 0;
  };

  Fact* fact(int64_t id);
  const Fact* fact(int64_t id) const;
  int64_t base_of(int64_t id) const;
  void see(const trace::OpRecord& op, const trace::TraceReader& r);
  void spread(const trace::OpRecord& op, bool watched);
  TensorRole role_of(int64_t id, bool reaches) const;
  std::vector<Answer> answers(const std::vector<Watched>& w) const;

  std::vector<Fact> facts_;
  std::unordered_map<int64_t, int64_t> view_base_;  // a view's id -> its base's
  std::unordered_map<int64_t, uint32_t> taint_;     // id -> watched tensors it derives from
  std::vector<Watched> watched_inputs_, watched_outputs_;
  uint32_t reached_ = 0;  // watched tensors whose data reached a training-state write
  bool watched_seen_ = false;
  int64_t next_unseen_ = 0;
};

// The roles of the first divergence's differing tensors (TensorPair::tensor_role) and whether
// the difference reaches the training state (FirstDivergence::training), from run A's trace of
// its stream, read once.
Status find_roles(const std::string& path_a, FirstDivergence* fd);

}  // namespace detaudit
