// What the sentinel (Config::sentinel) keeps of a thread's steps, apart from the op path: an
// optimizer step's state, gathered while its ops run unrecorded and written as one record when
// its mark ends; that state's CPU tensors described ahead, spread over torch's intra-op threads;
// and the op that last made a loss, which names the loss of a lean step.
#pragma once

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <cstdint>
#include <string>
#include <typeinfo>
#include <unordered_map>
#include <vector>

#include "digest/digest.h"
#include "ops/op_schema.h"
#include "tensors/tensor_cache.h"
#include "trace/format.h"

namespace detaudit::hooks {

class SentinelSteps {
 public:
  // An optimizer step's mark opens: its ops' tensors are noted, not recorded one by one.
  void open_step(const char* mark) {
    step_.open = true;
    step_.mark = mark;
  }
  bool step_open() const { return step_.open; }
  const std::string& step_mark() const { return step_.mark; }
  // The scope path of the label naming the step's optimizer (trace/records.h), if one opens
  // inside the step: the step's record is written under it.
  void label_step(std::string scope_path) { step_.labelled_scope = std::move(scope_path); }
  // A tensor argument of one of the step's ops; `leaves`: the op writes or makes it.
  void note(const c10::IValue& v, bool leaves);

  // The step ends: what it read and did not write, and what it leaves, alive, in order of first
  // use (empty unless `wanted`); the label's scope path, "" if none. The state is emptied, its
  // capacity kept for the next step.
  struct Taken {
    c10::List<at::Tensor> read, left;
    std::string labelled_scope;
  };
  Taken take_step(bool wanted);

  // The taken state's CPU tensors described now, over `threads` of torch's pool (the op's thread
  // alone took 1.3 ms a step on GPT-2: 3% of it), when there are
  // enough bytes to be worth it (returns whether it did); until forget_described(), described()
  // answers for them.
  bool describe_ahead(const Taken& state, size_t threads, trace::DigestAlgo algo, bool stats);
  // The description made ahead of t, null if none: all but its view's base and its sharing.
  // Inline: every tensor the op path describes asks, and the answer is almost always no.
  const trace::TensorDesc* described(const at::Tensor& t, uint64_t* bytes) const {
    return ahead_at_.empty() ? nullptr : find_described(t, bytes);
  }
  void forget_described() {
    ahead_.clear();
    ahead_at_.clear();
  }

  // A top-level forward op recorded what looks like a loss.
  void recorded_loss(const c10::TensorImpl* loss, const OpInfo* maker) {
    last_loss_ = {loss, maker};
  }
  // A backward mark's loss, in a step that saw every op: if the last recorded loss is it, the
  // type of its autograd node and the op that made it are remembered for lean steps.
  void backward_from(const c10::TensorImpl* loss, const std::type_info* node) {
    if (node && loss == last_loss_.impl) loss_maker_ = {node, last_loss_.info};
  }
  // In a lean step: the op that made a loss whose autograd node is of this type, as the last
  // one seen in full did; null if none.
  const OpInfo* loss_maker(const std::type_info* node) const {
    return node && loss_maker_.node && *node == *loss_maker_.node ? loss_maker_.info : nullptr;
  }

 private:
  const trace::TensorDesc* find_described(const at::Tensor& t, uint64_t* bytes) const;

  struct StepState {
    bool open = false;
    std::string mark;  // "Optimizer.step#AdamW.step", "detaudit::optimizer"
    std::string labelled_scope;
    // In order of first use; weak: a temporary dies, and its address is not reused meanwhile.
    std::vector<TensorCache::WeakImpl> read, left;
    std::unordered_map<const c10::TensorImpl*, bool> left_of;  // seen: true once written or made
  } step_;
  struct Described {
    at::Tensor tensor;
    trace::TensorDesc desc;
    uint64_t bytes = 0;
  };
  std::vector<Described> ahead_;
  std::unordered_map<const c10::TensorImpl*, size_t> ahead_at_;
  // The last loss recorded (compared by address only), and the op that made the loss a
  // backward mark carried in a step that saw every op, with the type of its autograd node.
  struct LastLoss {
    const c10::TensorImpl* impl = nullptr;
    const OpInfo* info = nullptr;
  } last_loss_;
  struct LossMaker {
    const std::type_info* node = nullptr;
    const OpInfo* info = nullptr;
  } loss_maker_;
};

}  // namespace detaudit::hooks
