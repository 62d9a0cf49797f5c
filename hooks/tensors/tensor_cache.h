// hooks/tensors: tensors: which versions a stream already described, and their bytes' digests
// and statistics, on the CPU (alone, in MD5 batches, large ones in leaves) and on the GPU.
//
// One stream's memory of the tensors it described, so that a tensor version is hashed once and
// later ops refer to it (TENSOR_REF) instead of hashing it again.
//
// The rules, all here:
// - An entry describes one TensorImpl at one version-counter value, with its geometry. It is
//   valid while the TensorImpl lives, its version and geometry match, and no op wrote its
//   storage since (`StorageState::writes`).
// - A write through any alias (`p.data.add_()`, whose version counter is not p's) bumps the
//   storage's `writes`, which retires every entry over that storage at once.
// - An entry for a tensor that entered from outside torch (provenance external or compiled) is
//   trusted only within the top-level op that described it: code outside the dispatcher may
//   write it unseen between ops.
// - Another TensorImpl over bytes already described (autograd's saved tensors, detach(), a
//   reshape such as x.view(-1, C)) reuses that description when it reads the same bytes in the
//   same order (same_bytes_in_order): the storage remembers its last written tensor, by key, and
//   the last few geometries read since. So does a composite op's output over such bytes.
// - Entries refer to each other by key, never by pointer: a slot reused by a newer version
//   cannot stand in for the old one.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/UndefinedTensorImpl.h>

#include <array>
#include <memory_resource>
#include <unordered_map>
#include <vector>

#include "stream/pending_records.h"
#include "trace/records.h"

namespace detaudit::hooks {

class TensorCache {
 public:
  using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

  // One tensor version this stream has described.
  // TensorCache::remember sets every field: one added here must be set there too.
  struct Entry {
    WeakImpl impl{c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>()};
    uint32_t version = 0;
    int64_t id = -1;               // trace tensor id; -1: described, not written yet
    uint64_t external_serial = 0;  // entered from outside: valid in this top-level op only
    const c10::StorageImpl* storage = nullptr;  // key of its StorageState, if it has storage
    uint64_t storage_writes = 0;                // the storage's `writes` when described
    int64_t storage_offset = 0;
    int64_t base_id = -1;           // for views: the id of the tensor whose bytes these are
    uint64_t written_order = 0;     // order of the op whose output it is; 0 when seen as input
    uint64_t top_level_serial = 0;  // the top-level op during which it was described
    uint64_t read_serial = 0;       // the top-level op that last found it valid (lookup)
    trace::TensorDesc desc;
    std::shared_ptr<const PendingDigest> pending;  // desc's device digest, while on its way
  };

  // The last recorded write to a storage, and geometries of its bytes read since.
  struct StorageState {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage{c10::intrusive_ptr<c10::StorageImpl>()};
    uint64_t writes = 0;
    uint32_t version = 0;                   // of the tensor last written here
    int64_t id = -1;                        // its trace tensor id, once written
    const c10::TensorImpl* last = nullptr;  // its entry's key
    uint32_t last_version = 0;
    bool uninitialized = false;  // the last write left bytes no kernel wrote (empty, resize_)
    // ... and nothing will fill them outside the dispatcher either: not a tensor constructor's
    // buffer (torch.tensor(list) fills an `empty` with Python data). A read of such bytes is
    // a read of garbage.
    bool garbage = false;
    struct View {
      uint64_t writes = UINT64_MAX;
      int64_t offset = 0;
      trace::TensorDesc desc;
      std::shared_ptr<const PendingDigest> pending;
    };
    std::array<View, 2> views;  // w.t() each timestep: two geometries of the same bytes
    uint8_t next_view = 0;
    // Bytes in shared memory: what this stream last hashed there, and its `writes` then. Other
    // hashes of the same geometry since, with no write of its own, are another process's.
    trace::TensorDesc shared_seen;
    int64_t shared_seen_offset = -1;
    uint64_t shared_seen_writes = 0;

    // As if new, but for the weak reference: what a fresh state holds, field by field. Freed
    // storages' addresses come back on most ops, and a whole new state would build three
    // TensorDescs. The descriptions stay, unread: `views[i].writes` and `shared_seen_offset` say
    // they are void.
    void reset() {
      writes = 0;
      version = 0;
      id = -1;
      last = nullptr;
      last_version = 0;
      uninitialized = garbage = false;
      for (View& v : views) {
        v.writes = UINT64_MAX;
        v.pending.reset();
      }
      next_view = 0;
      shared_seen_offset = -1;
      shared_seen_writes = 0;
    }
  };

  // Marks desc (just hashed from t, in shared memory) kChangedElsewhere when its bytes differ
  // from what this stream last hashed of them with no recorded write since, else kSharedMemory.
  void note_shared_bytes(StorageState* st, const at::Tensor& t, trace::TensorDesc* desc);

  explicit TensorCache(bool rehash_inputs);

  // The top-level op now running (its serial number, counted by the recorder).
  void set_top_level_serial(uint64_t serial) { top_level_serial_ = serial; }

  // The entry describing this tensor at `version`, if still valid; `allow_external` admits an
  // external entry described in this top-level op.
  Entry* lookup(const at::Tensor& t, uint32_t version, bool allow_external);
  // The entry under `key` if it still is the version (and storage state) an op saw at its start.
  Entry* find_unchanged(const c10::TensorImpl* key, uint32_t version, uint64_t storage_writes);
  StorageState* storage_of(const at::Tensor& t);
  // The written tensor whose bytes t views, if they are unchanged and not uninitialized.
  bool bytes_known(const StorageState* st, uint32_t version) const;
  // The same for a view with a version counter of its own: one a kernel made below autograd
  // (addmm's expand of its bias), which never saw the base's bumps. Known if the tensor last
  // written there was found valid in this top-level op and nothing wrote the storage since.
  bool bytes_known_in_this_op(const StorageState* st) const;
  // A description of exactly t's bytes, in t's order, made since the storage's last write, if
  // any, and its device digest if that is still on its way. Its sizes may be another reshape's
  // (take_geometry).
  const trace::TensorDesc* described_geometry(StorageState* st, const at::Tensor& t,
                                              std::shared_ptr<const PendingDigest>* pending);
  void remember_geometry(StorageState* st, const at::Tensor& t, const trace::TensorDesc& desc,
                         const std::shared_ptr<const PendingDigest>& pending);
  // A fresh entry for this tensor version, described by `desc` (and `pending`, its device digest
  // on its way).
  Entry& remember(const at::Tensor& t, uint32_t version, const trace::TensorDesc& desc,
                  std::shared_ptr<const PendingDigest> pending = nullptr);
  // An op wrote this tensor (entry `e`, now written as trace id e.id): it is the storage's new
  // content, and every other entry over the storage retires.
  // `filled_outside`: a tensor constructor's `empty`, about to be filled with data.
  void wrote(const at::Tensor& t, uint32_t version, Entry& e, bool filled_outside = false);
  // A write no record shows (an unrecorded op's output): retire what describes its storage.
  void wrote_unseen(const at::Tensor& t);
  void forget(const c10::TensorImpl* key) { entries_.erase(key); }
  void clear();

 private:
  bool valid(const Entry& e) const;
  // The entry of the tensor last written to st, if neither it nor the storage changed since.
  const Entry* last_written_unchanged(const StorageState* st) const;
  void make_room();

  bool rehash_inputs_;
  uint64_t top_level_serial_ = 0;
  size_t room_;  // entries before the next sweep (make_room)
  // Entries come and go on most ops: their nodes come from a pool, not malloc. The pool is
  // declared first so that it outlives them.
  std::pmr::unsynchronized_pool_resource memory_;
  std::pmr::unordered_map<const c10::TensorImpl*, Entry> entries_{&memory_};
  std::pmr::unordered_map<const c10::StorageImpl*, StorageState> storages_{&memory_};
  // What the last clear() let go, held one clear longer (clear()).
  std::vector<WeakImpl> retired_impls_;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> retired_storages_;
};

// The cached description still matches the tensor's view of its storage: dtype, offset, sizes
// and strides.
bool same_geometry(const trace::TensorDesc& d, int64_t offset, const at::Tensor& t);

// d describes t's bytes in t's order: the same geometry, or a reshape of the same contiguous
// bytes.
bool same_bytes_in_order(const trace::TensorDesc& d, int64_t offset, const at::Tensor& t);
// desc, made for a reshape of t's bytes (same_bytes_in_order), takes t's sizes.
void take_geometry(const at::Tensor& t, trace::TensorDesc* desc);

uint32_t tensor_version(const at::Tensor& t);

}  // namespace detaudit::hooks
