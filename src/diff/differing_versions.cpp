#include "diff/differing_versions.h"

#include <algorithm>

namespace detaudit {

void DifferingVersions::add(int64_t id) {
  if (id >= 0 && !contains(id)) ids_.push_back(id);
}

void DifferingVersions::add_enclosing_output(int64_t id, const trace::TraceReader& r) {
  const trace::TensorDesc* t = r.tensor(id);
  if (t && !contains(id)) {
    // No op read them in between (that would have confirmed), so equal bytes are one tensor.
    ids_.erase(std::remove_if(ids_.begin(), ids_.end(),
                              [&](int64_t old) {
                                const trace::TensorDesc* o = r.tensor(old);
                                return o && o->same_digest(*t) && o->dtype == t->dtype &&
                                       o->sizes == t->sizes;
                              }),
               ids_.end());
  }
  add(id);
}

bool DifferingVersions::contains(int64_t id) const {
  return std::find(ids_.begin(), ids_.end(), id) != ids_.end();
}

bool DifferingVersions::read_at(const trace::OpRecord& op, size_t i,
                                const trace::TraceReader& r) const {
  if (ids_.empty() || i >= op.input_tensors.size()) return false;
  int64_t id = op.input_tensors[i];
  const trace::TensorDesc* in = r.tensor(id);
  if (op.input_written(i) || (in && in->not_read())) return false;
  // A view shares the bytes of its base: follow the bases inside the reader's window.
  for (int hops = 0; id >= 0 && hops < 64; ++hops) {
    if (contains(id)) return true;
    const trace::TensorDesc* t = r.tensor(id);
    if (!t || t->provenance() != trace::Provenance::kView) break;
    id = t->base_id;
  }
  return false;
}

bool DifferingVersions::same_bytes_as_one(const trace::TensorDesc& t,
                                          const trace::TraceReader& r) const {
  if (!t.has_contents()) return false;
  for (int64_t id : ids_)
    if (const trace::TensorDesc* o = r.tensor(id);
        o && o->has_contents() && o->same_digest(t) && o->dtype == t.dtype && o->sizes == t.sizes)
      return true;
  return false;
}

bool DifferingVersions::forget_written(const trace::OpRecord& op, const trace::TraceReader& r) {
  bool forgot = false;
  for (size_t i = 0; i < op.input_tensors.size() && !ids_.empty(); ++i) {
    int64_t id = op.input_tensors[i];
    const trace::TensorDesc* in = r.tensor(id);
    if (!op.input_written(i) && !(in && in->not_read())) continue;
    // FSDP2's uniform_ on the sharded parameter writes a view of the padded buffer's slot.
    const uint64_t numel = in ? in->numel() : 0;
    for (int hops = 0; id >= 0 && hops < 64; ++hops) {
      auto it = std::find(ids_.begin(), ids_.end(), id);
      if (it != ids_.end()) {
        ids_.erase(it);
        forgot = true;
        break;
      }
      const trace::TensorDesc* t = r.tensor(id);
      if (!t || t->provenance() != trace::Provenance::kView) break;
      id = t->base_id;
      const trace::TensorDesc* base = r.tensor(id);
      if (!base || base->numel() != numel) break;  // a part of it: the rest may still differ
    }
  }
  return forgot;
}

bool DifferingVersions::in_reach(const trace::TraceReader& r) const {
  // Half the window, as OpSource keeps buffered ops' tensors: a reference can never be missed.
  for (int64_t id : ids_)
    if (r.tensors_seen() - id > int64_t(trace::kRefWindow / 2)) return false;
  return true;
}

}  // namespace detaudit
