#include "recorder/sentinel_steps.h"

#include <algorithm>

#include "digest/hashers.h"
#include "digest/tensor_digester.h"
#include "tensors/tensor_digest.h"
#include "util/balance.h"

namespace detaudit::hooks {

void SentinelSteps::note(const c10::IValue& v, bool leaves) {
  auto note_tensor = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    auto [it, first] = step_.left_of.emplace(impl, leaves);
    if (!first && (it->second || !leaves)) return;
    it->second = leaves;
    auto& list = leaves ? step_.left : step_.read;
    list.emplace_back(t.getIntrusivePtr());
  };
  if (v.isTensor()) {
    note_tensor(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) note_tensor(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef())
      if (e.isTensor()) note_tensor(e.toTensor());
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements())
      if (e.isTensor()) note_tensor(e.toTensor());
  }
}

SentinelSteps::Taken SentinelSteps::take_step(bool wanted) {
  Taken taken;
  if (wanted) {
    for (const TensorCache::WeakImpl& w : step_.read)
      if (auto impl = w.lock(); impl && !step_.left_of.find(impl.get())->second)
        taken.read.push_back(at::Tensor(std::move(impl)));
    for (const TensorCache::WeakImpl& w : step_.left)
      if (auto impl = w.lock()) taken.left.push_back(at::Tensor(std::move(impl)));
  }
  // Emptied, not rebuilt: the next step reuses the capacity.
  step_.open = false;
  step_.read.clear();
  step_.left.clear();
  step_.left_of.clear();
  taken.labelled_scope = std::move(step_.labelled_scope);
  step_.labelled_scope.clear();
  return taken;
}

bool SentinelSteps::describe_ahead(const Taken& state, size_t threads, trace::DigestAlgo algo,
                                   bool stats) {
  // Below this a parallel region's wake-up costs more than it saves.
  constexpr uint64_t kMinBytes = uint64_t(1) << 20;
  if (threads < 2) return false;
  uint64_t total = 0;
  for (const c10::List<at::Tensor>* list : {&state.read, &state.left})
    for (size_t i = 0; i < list->size(); ++i) {
      at::Tensor t = list->get(i);
      // A tensor of several leaves is left to describe_tensor, which spreads its leaves.
      if (!t.defined() || !t.is_cpu() || t.is_conj() || t.is_neg() || t.numel() == 0 ||
          t.nbytes() > kLeafBytes || unhashable_reason(t) || has_no_data(t))
        continue;
      if (!ahead_at_.emplace(t.unsafeGetTensorImpl(), ahead_.size()).second) continue;
      total += t.nbytes();
      ahead_.push_back({std::move(t), {}, 0});
    }
  if (total < kMinBytes) {
    forget_described();
    return false;
  }
  // Largest first, each to the group with the fewest bytes so far: the groups end together.
  std::vector<size_t> order(ahead_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return ahead_[a].tensor.nbytes() > ahead_[b].tensor.nbytes();
  });
  constexpr size_t kMaxGroups = 64;
  const size_t groups = std::min({threads, order.size(), kMaxGroups});
  std::vector<uint8_t> group_of(order.size());
  balance_groups<kMaxGroups>(
      order.size(), groups, [&](size_t k) { return ahead_[order[k]].tensor.nbytes(); },
      group_of.data());
  on_torch_pool(groups, [&](size_t from, size_t to) {
    Hasher hasher(algo);
    for (size_t k = 0; k < order.size(); ++k)
      if (group_of[k] >= from && group_of[k] < to) {
        Described& d = ahead_[order[k]];
        d.bytes = describe_tensor(d.tensor, &hasher, stats, &d.desc);
      }
  });
  return true;
}

const trace::TensorDesc* SentinelSteps::find_described(const at::Tensor& t, uint64_t* bytes) const {
  auto it = ahead_at_.find(t.unsafeGetTensorImpl());
  if (it == ahead_at_.end()) return nullptr;
  *bytes = ahead_[it->second].bytes;
  return &ahead_[it->second].desc;
}

}  // namespace detaudit::hooks
