#include "tensors/tensor_cache.h"

#include <algorithm>

#include "tensors/tensor_digest.h"

namespace detaudit::hooks {
namespace {
// The entries' table is swept of dead tensors when it reaches its room, twice what the last sweep
// left. Most entries die within a few ops, and until a sweep each holds its dead TensorImpl's
// memory (the weak reference) away from malloc, which then hands the program cold memory: a room
// that only grew (to 4,096 and up) cost the small-op `lstm` 2 ms a step of 27.
constexpr size_t kMinRoom = 1 << 8;
constexpr size_t kMaxRoom = 1 << 16;
}  // namespace

TensorCache::TensorCache(bool rehash_inputs) : rehash_inputs_(rehash_inputs), room_(kMinRoom) {}

bool same_geometry(const trace::TensorDesc& d, int64_t offset, const at::Tensor& t) {
  // The dtype too: x.view(torch.int32) reads the same bytes as other values.
  if (offset != t.storage_offset() || d.dtype != dtype_of(t)) return false;
  auto sizes = t.sizes();
  if (d.sizes.size() != sizes.size() || !std::equal(sizes.begin(), sizes.end(), d.sizes.begin()))
    return false;
  if (d.bits & trace::kTensorContiguous) return t.is_contiguous();
  auto strides = t.strides();
  return std::equal(strides.begin(), strides.end(), d.strides.begin(), d.strides.end());
}

bool same_bytes_in_order(const trace::TensorDesc& d, int64_t offset, const at::Tensor& t) {
  if (same_geometry(d, offset, t)) return true;
  // A reshape of contiguous bytes (x.view(-1, C), _unsafe_view): the same bytes in the same
  // order, so the same digest and statistics, whatever the shape.
  if (!(d.bits & trace::kTensorContiguous) || offset != t.storage_offset() ||
      d.dtype != dtype_of(t) || !t.is_contiguous())
    return false;
  int64_t numel = 1;
  for (int64_t s : d.sizes) numel *= s;
  return numel == t.numel();
}

void take_geometry(const at::Tensor& t, trace::TensorDesc* desc) {
  auto sizes = t.sizes();
  if (desc->sizes.size() == sizes.size() &&
      std::equal(sizes.begin(), sizes.end(), desc->sizes.begin()))
    return;
  desc->sizes.assign(sizes.begin(), sizes.end());
}

uint32_t tensor_version(const at::Tensor& t) {
  const auto& vc = t.unsafeGetTensorImpl()->version_counter();
  return vc.enabled() ? vc.current_version() : 0;
}

bool TensorCache::valid(const Entry& e) const {
  if (e.impl.expired()) return false;
  if (!e.storage) return true;
  auto it = storages_.find(e.storage);
  return it != storages_.end() && !it->second.storage.expired() &&
         it->second.writes == e.storage_writes;
}

TensorCache::Entry* TensorCache::lookup(const at::Tensor& t, uint32_t version,
                                        bool allow_external) {
  auto it = entries_.find(t.unsafeGetTensorImpl());
  if (it == entries_.end()) return nullptr;
  Entry& e = it->second;
  if (e.version != version || !same_geometry(e.desc, e.storage_offset, t) || !valid(e))
    return nullptr;
  if (e.external_serial != 0 && (!allow_external || e.external_serial != top_level_serial_))
    return nullptr;
  // Trusting no writer outside torch: what an earlier top-level op saw is not evidence.
  if (rehash_inputs_ && e.top_level_serial != top_level_serial_) return nullptr;
  e.read_serial = top_level_serial_;
  return &e;
}

TensorCache::Entry* TensorCache::find_unchanged(const c10::TensorImpl* key, uint32_t version,
                                                uint64_t storage_writes) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  Entry& e = it->second;
  // A nested in-place kernel may have written it without a version bump: a storage write.
  if (e.version != version || e.impl.expired() || e.storage_writes != storage_writes)
    return nullptr;
  return &e;
}

TensorCache::StorageState* TensorCache::storage_of(const at::Tensor& t) {
  if (!t.has_storage()) return nullptr;
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  StorageState& st = storages_[impl];
  if (st.storage.expired()) {  // new, or a freed storage's address reused
    st.reset();
    st.storage = t.storage().getWeakStorageImpl();
  }
  return &st;
}

bool TensorCache::bytes_known(const StorageState* st, uint32_t version) const {
  // Bytes an op reads after an `empty` were written outside the dispatcher: not known.
  return st && st->id >= 0 && st->version == version && !st->uninitialized;
}

const TensorCache::Entry* TensorCache::last_written_unchanged(const StorageState* st) const {
  auto it = entries_.find(st->last);
  if (it == entries_.end()) return nullptr;
  const Entry& last = it->second;
  return last.version == st->last_version && last.storage_writes == st->writes ? &last : nullptr;
}

bool TensorCache::bytes_known_in_this_op(const StorageState* st) const {
  if (!st || st->id < 0 || st->uninitialized) return false;
  const Entry* last = last_written_unchanged(st);
  return last && last->read_serial == top_level_serial_;
}

const trace::TensorDesc* TensorCache::described_geometry(
    StorageState* st, const at::Tensor& t, std::shared_ptr<const PendingDigest>* pending) {
  if (!st || rehash_inputs_) return nullptr;
  if (const Entry* last = last_written_unchanged(st);
      last && last->storage == t.storage().unsafeGetStorageImpl() &&
      same_bytes_in_order(last->desc, last->storage_offset, t)) {
    *pending = last->pending;
    return &last->desc;
  }
  for (const StorageState::View& v : st->views)
    if (v.writes == st->writes && same_bytes_in_order(v.desc, v.offset, t)) {
      *pending = v.pending;
      return &v.desc;
    }
  return nullptr;
}

void TensorCache::remember_geometry(StorageState* st, const at::Tensor& t,
                                    const trace::TensorDesc& desc,
                                    const std::shared_ptr<const PendingDigest>& pending) {
  if (!st) return;
  StorageState::View& v = st->views[st->next_view++ % st->views.size()];
  v.writes = st->writes;
  v.offset = t.storage_offset();
  v.desc = desc;
  v.pending = pending;
}

TensorCache::Entry& TensorCache::remember(const at::Tensor& t, uint32_t version,
                                          const trace::TensorDesc& desc,
                                          std::shared_ptr<const PendingDigest> pending) {
  make_room();
  Entry& e = entries_[t.unsafeGetTensorImpl()];
  // Field by field, not `e = Entry{}`: a temporary Entry would build and copy a whole TensorDesc.
  e.impl = WeakImpl(t.getIntrusivePtr());
  e.version = version;
  e.id = -1;
  e.external_serial = 0;
  e.storage = nullptr;
  e.storage_writes = 0;
  e.storage_offset = t.storage_offset();
  e.base_id = -1;
  e.written_order = 0;
  e.top_level_serial = top_level_serial_;
  e.desc = desc;
  e.pending = std::move(pending);
  return e;
}

void TensorCache::wrote(const at::Tensor& t, uint32_t version, Entry& e, bool filled_outside) {
  StorageState* st = storage_of(t);
  if (!st) return;
  ++st->writes;
  st->version = version;
  st->id = e.id;
  st->last = t.unsafeGetTensorImpl();
  st->last_version = version;
  st->uninitialized = e.desc.uninitialized();
  st->garbage = st->uninitialized && !filled_outside;
  e.storage = t.storage().unsafeGetStorageImpl();
  e.storage_writes = st->writes;
}

void TensorCache::wrote_unseen(const at::Tensor& t) {
  if (StorageState* st = storage_of(t)) {
    ++st->writes;
    st->uninitialized = st->garbage = false;  // some kernel wrote it
  }
}

void TensorCache::note_shared_bytes(StorageState* st, const at::Tensor& t,
                                    trace::TensorDesc* desc) {
  desc->sharing = trace::Sharing::kSharedMemory;
  if (!st) return;
  if (st->shared_seen_offset >= 0 && st->shared_seen_writes == st->writes &&
      same_geometry(st->shared_seen, st->shared_seen_offset, t) &&
      !st->shared_seen.same_digest(*desc))
    desc->sharing = trace::Sharing::kChangedElsewhere;
  st->shared_seen = *desc;
  st->shared_seen_offset = t.storage_offset();
  st->shared_seen_writes = st->writes;
}

void TensorCache::make_room() {
  if (entries_.size() < room_) return;
  // Forget what died; the rest stays valid.
  for (auto it = entries_.begin(); it != entries_.end();)
    it = valid(it->second) ? std::next(it) : entries_.erase(it);
  for (auto it = storages_.begin(); it != storages_.end();)
    it = it->second.storage.expired() ? storages_.erase(it) : std::next(it);
  if (entries_.size() >= kMaxRoom * 3 / 4) {
    clear();
    room_ = kMinRoom;
    return;
  }
  room_ = std::clamp(2 * entries_.size(), kMinRoom, kMaxRoom);
}

void TensorCache::clear() {
  // The TensorImpls and StorageImpls the entries refer to weakly are let go one clear later.
  // Freed all at once, at each of the lean sentinel's steps, they let glibc consolidate and trim
  // its heap under the program's large tensors, then fault them back in: embed, 1.5x plain
  // against 1.1x (docs/performance.md).
  retired_impls_.clear();
  retired_storages_.clear();
  for (auto& [key, e] : entries_) retired_impls_.push_back(std::move(e.impl));
  for (auto& [key, st] : storages_) retired_storages_.push_back(std::move(st.storage));
  entries_.clear();
  storages_.clear();
}

}  // namespace detaudit::hooks
