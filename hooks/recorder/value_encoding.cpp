// Value encoding: an op's inputs as trace values when it starts, its outputs when it ends, with
// the tensor cache deciding what is hashed and what is referred to (tensor_cache.h).
#include <ATen/ATen.h>
#include <ATen/MapAllocator.h>
#include <dlfcn.h>
#include <link.h>

#include <string>
#include <string_view>

#include "recorder/recorder.h"
#include "tensors/cuda_graphs.h"
#include "tensors/tensor_digest.h"

namespace detaudit::hooks {

using trace::ByteWriter;
using trace::ValueType;

namespace {

// torch.multiprocessing's file_system strategy maps through libshm's allocator, which only
// Python programs load, privately (torch._C is loaded RTLD_LOCAL): found among the loaded
// objects, not linked. Resolved at the first op, when torch is loaded.
using ManagedFromDataPtr = void* (*)(const c10::DataPtr&);
ManagedFromDataPtr libshm_from_data_ptr() {
  static const ManagedFromDataPtr f = [] {
    std::string path;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* found) {
          std::string_view name = info->dlpi_name ? info->dlpi_name : "";
          const size_t slash = name.rfind('/');
          if (name.substr(slash == std::string_view::npos ? 0 : slash + 1).substr(0, 9) !=
              "libshm.so")
            return 0;
          *static_cast<std::string*>(found) = std::string(name);
          return 1;
        },
        &path);
    void* lib = path.empty() ? nullptr : ::dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    return lib ? reinterpret_cast<ManagedFromDataPtr>(
                     ::dlsym(lib, "_ZN21THManagedMapAllocator11fromDataPtrERKN3c107DataPtrE"))
               : nullptr;
  }();
  return f;
}

// Bytes other processes map too: share_memory_() and DataLoader batches, under either strategy
// of torch.multiprocessing (file_descriptor, the default on Linux, or file_system). A check of
// the DataPtr's deleter.
bool in_shared_memory(const at::Tensor& t) {
  if (!t.has_storage() || !t.is_cpu()) return false;
  const c10::DataPtr& p = t.storage().data_ptr();
  if (at::MapAllocator::fromDataPtr(p) || at::RefcountedMapAllocator::fromDataPtr(p)) return true;
  const ManagedFromDataPtr managed = libshm_from_data_ptr();
  return managed && managed(p);
}

}  // namespace

void ThreadRecorder::flush_bytes_item() {
  if (bytes_.size() > bytes_item_start_)
    items_.push_back(Item{false, uint32_t(bytes_item_start_), uint32_t(bytes_.size())});
  bytes_item_start_ = bytes_.size();
}

void ThreadRecorder::capture_value(const c10::IValue& v, Use use) {
  ByteWriter w(&bytes_);
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      w.u8(uint8_t(ValueType::kNone));
    } else if (const char* why = unhashable_reason(t)) {
      saw_fake_tensor_ |= why == kNoDataReason;
      w.u8(uint8_t(ValueType::kTensorSkipped));
      w.varint(sink_.intern(why));
    } else {
      capture_tensor(t, use);
    }
  } else if (v.isNone()) {
    w.u8(uint8_t(ValueType::kNone));
  } else if (v.isBool()) {
    w.u8(uint8_t(v.toBool() ? ValueType::kBoolTrue : ValueType::kBoolFalse));
  } else if (v.isInt()) {
    w.u8(uint8_t(ValueType::kInt));
    w.zvarint(v.toInt());
  } else if (v.isDouble()) {
    w.u8(uint8_t(ValueType::kDouble));
    w.f64(v.toDouble());
  } else if (v.isString()) {
    w.u8(uint8_t(ValueType::kString));
    w.varint(sink_.intern(v.toStringRef()));
  } else if (v.isIntList()) {
    auto list = v.toIntList();
    w.u8(uint8_t(ValueType::kIntList));
    w.varint(list.size());
    for (int64_t x : list) w.zvarint(x);
  } else if (v.isDoubleList()) {
    auto list = v.toDoubleList();
    w.u8(uint8_t(ValueType::kDoubleList));
    w.varint(list.size());
    for (double x : list) w.f64(x);
  } else if (v.isBoolList()) {
    auto list = v.toBoolList();
    w.u8(uint8_t(ValueType::kBoolList));
    w.varint(list.size());
    for (bool x : list) w.u8(x);
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    w.u8(uint8_t(ValueType::kList));
    w.varint(list.size());
    for (const at::Tensor& t : list) capture_value(t, use);
  } else if (v.isList()) {
    auto list = v.toListRef();
    w.u8(uint8_t(ValueType::kList));
    w.varint(list.size());
    for (const c10::IValue& e : list) capture_value(e, use);
  } else if (v.isTuple()) {
    const auto& elems = v.toTupleRef().elements();
    w.u8(uint8_t(ValueType::kList));
    w.varint(elems.size());
    for (const c10::IValue& e : elems) capture_value(e, use);
  } else if (v.isDevice()) {
    w.u8(uint8_t(ValueType::kDevice));
    w.u8(uint8_t(v.toDevice().type()));
    w.zvarint(v.toDevice().index());
  } else if (v.isGenerator()) {
    w.u8(uint8_t(ValueType::kGenerator));
    w.u64(generator_digest(v.toGenerator()));
  } else {
    w.u8(uint8_t(ValueType::kOther));
    w.varint(sink_.intern(v.tagKind()));
  }
}

void ThreadRecorder::capture_tensor(const at::Tensor& t, Use use) {
  flush_bytes_item();
  if (snaps_top_ == snaps_.size()) snaps_.resize(snaps_.size() * 2 + 8);
  Snapshot& s = snaps_[snaps_top_];
  items_.push_back(Item{true, uint32_t(snaps_top_), 0});
  ++snaps_top_;

  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  s.key = impl;
  s.cacheable = !impl->is_inference();
  s.version = tensor_version(t);
  s.base_id = -1;
  s.pending.reset();
  s.written = use == Use::kWrittenInFull;
  if (use == Use::kRead && collectives_.unfilled_buffer(t)) use = Use::kNotRead;

  if (s.cacheable) {
    TensorCache::Entry* e = cache_.lookup(t, s.version, /*allow_external=*/true);
    // Bytes an op reads after an `empty` were written by code outside the dispatcher
    // (torch.tensor(list), NumPy): hash them as found.
    if (e && !e->desc.uninitialized()) {
      s.desc = e->desc;
      s.pending = e->pending;
      s.base_id = e->base_id;
      s.storage_writes = e->storage_writes;
      return;
    }
  }
  // First sight of this TensorImpl at this version. Another TensorImpl over the same bytes
  // (autograd's saved tensors, detach()) reuses their description; otherwise hash.
  const bool shared = in_shared_memory(t);
  const bool replayed = written_by_cuda_graph(t);
  TensorCache::StorageState* st = cache_.storage_of(t);
  // Another process, or a CUDA graph's replay, may have written these bytes since: describe
  // them as found.
  const bool same_bytes_known = !shared && !replayed &&
                                (cache_.bytes_known(st, s.version) ||
                                 cache_.bytes_known_in_this_op(st));
  // First seen after a compiled region ran: most likely its output, made by kernels we cannot see.
  trace::Provenance prov = same_bytes_known           ? trace::Provenance::kView
                           : compiled_region_in_step_ ? trace::Provenance::kCompiled
                                                      : trace::Provenance::kExternal;
  if (same_bytes_known) s.base_id = st->id;
  const trace::TensorDesc* known = same_bytes_known ? cache_.described_geometry(st, t, &s.pending)
                                                    : nullptr;
  if (known) {
    s.desc = *known;
    take_geometry(t, &s.desc);
  } else if (use != Use::kRead || captured_into_cuda_graph(t)) {
    // Bytes the op never reads, or a graph capture's, not there before a replay: their shape
    // says enough. Not cached, so no later reader of this version is told "not read".
    describe_geometry(t, hasher_->length(), &s.desc);
    s.desc.bits |= trace::kTensorNotRead;
    s.desc.set_provenance(prov);
    s.cacheable = false;
    return;
  } else {
    sink_.totals().bytes_hashed += describe_contents(t, &s.desc, &s.pending, /*may_wait=*/!shared);
    ++sink_.totals().tensors_hashed;
    if (st && st->garbage && st->version == s.version && st->id >= 0) {
      // Bytes no op wrote since an `empty` (and no constructor filled): a read of garbage,
      // its digest kept, its base the empty's output, which names the allocating op.
      s.desc.bits |= trace::kTensorUninitialized;
      prov = trace::Provenance::kView;
      s.base_id = st->id;
    }
    if (shared) cache_.note_shared_bytes(st, t, &s.desc);
    cache_.remember_geometry(st, t, s.desc, s.pending);
  }
  s.desc.set_provenance(prov);
  if (!s.cacheable) return;
  TensorCache::Entry& e = cache_.remember(t, s.version, s.desc, s.pending);
  e.external_serial = prov != trace::Provenance::kView || shared || replayed ? top_level_serial_
                                                                             : 0;
  e.storage = st ? t.storage().unsafeGetStorageImpl() : nullptr;
  e.storage_writes = st ? st->writes : 0;
  e.base_id = s.base_id;
  s.storage_writes = e.storage_writes;
}

void ThreadRecorder::emit_tensor(const Snapshot& s, ByteWriter& w) {
  if (s.cacheable) {
    // Still the version this op saw at its start?
    if (TensorCache::Entry* found = cache_.find_unchanged(s.key, s.version, s.storage_writes)) {
      TensorCache::Entry& e = *found;
      if (e.id >= 0 && next_tensor_id_ - e.id <= int64_t(trace::kRefWindow)) {
        w.u8(uint8_t(s.written ? ValueType::kTensorWritten : ValueType::kTensorRef));
        w.varint(uint64_t(next_tensor_id_ - e.id));
        return;
      }
      if (!s.written) e.id = next_tensor_id_;
    }
  }
  if (s.written) {
    // Overwritten since the op began (a nested op wrote it) or out of reach: its old bytes,
    // described again, would be compared as if read.
    trace::TensorDesc& desc = desc_scratch_;
    desc = s.desc;
    desc.digest.fill(0);
    desc.bits = uint8_t(
        (desc.bits | trace::kTensorNotRead) &
        ~(trace::kTensorHasStats | trace::kTensorHasNanInf | trace::kTensorIntStats));
    write_new(w, desc, s.base_id);
    return;
  }
  write_new(w, s.desc, s.base_id, s.pending);
}

uint64_t ThreadRecorder::describe_contents(const at::Tensor& t, trace::TensorDesc* desc,
                                           std::shared_ptr<const PendingDigest>* pending,
                                           bool may_wait) {
  const bool stats = ProcessRecorder::instance().config().stats;
  if (device_digest_ && t.numel() > 0 && digests_on_device(t)) {
    describe_geometry(t, hasher_->length(), desc);
    *pending = device_batch_.add(t, stats);
    return uint64_t(t.numel()) * uint64_t(t.element_size());
  }
  uint64_t bytes = 0;
  if (const trace::TensorDesc* ahead = sentinel_.described(t, &bytes)) {
    // As describe_tensor leaves it: all but the view's base and the sharing.
    const int64_t base_id = desc->base_id;
    const trace::Sharing sharing = desc->sharing;
    *desc = *ahead;
    desc->base_id = base_id;
    desc->sharing = sharing;
    pending->reset();
    return bytes;
  }
  if (md5_batch_ && sink_.inside() && may_wait && Md5TensorBatch::takes(t)) {
    describe_geometry(t, hasher_->length(), desc);
    *pending = md5_batch_->add(t, stats);
    if (*pending) return t.nbytes();
  }
  pending->reset();
  return describe_tensor(t, hasher_.get(), stats, desc);
}

int64_t ThreadRecorder::write_new(ByteWriter& w, const trace::TensorDesc& desc, int64_t base_id,
                                  const std::shared_ptr<const PendingDigest>& pending) {
  const int64_t id = next_tensor_id_++;
  if (desc.sharing != trace::Sharing::kNone) {
    w.u8(uint8_t(ValueType::kTensorNewShared));
    w.u8(uint8_t(desc.sharing));
  } else {
    w.u8(uint8_t(ValueType::kTensorNew));
  }
  uint64_t base_back = 0;
  trace::TensorDesc& copy = desc_copy_;
  const trace::TensorDesc* out = &desc;
  if (desc.provenance() == trace::Provenance::kView) {
    if (base_id >= 0 && base_id < id && id - base_id <= int64_t(trace::kRefWindow)) {
      base_back = uint64_t(id - base_id);
    } else {
      copy = desc;
      copy.set_provenance(trace::Provenance::kExternal);
      out = &copy;
    }
  }
  if (pending && !pending->done()) {
    // Filled in when the digest is in: the record waits, in its place (pending_records.h).
    holes_.push_back({sink_.encoder().scratch().size(), base_back, *out, pending});
    return id;
  }
  if (pending) {
    if (out != &copy) copy = desc;
    pending->apply(&copy);
    out = &copy;
  }
  trace::write_tensor(w, *out, base_back);
  return id;
}

void ThreadRecorder::emit_output(const c10::IValue& v, ByteWriter& w, const Frame& f,
                                 bool scratch) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      w.u8(uint8_t(ValueType::kNone));
    } else if (const char* why = unhashable_reason(t)) {
      w.u8(uint8_t(ValueType::kTensorSkipped));
      w.varint(sink_.intern(why));
    } else {
      emit_output_tensor(t, w, f, scratch);
    }
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    w.u8(uint8_t(ValueType::kList));
    w.varint(list.size());
    for (const at::Tensor& t : list) emit_output(t, w, f);
  } else if (v.isTuple()) {
    const auto& elems = v.toTupleRef().elements();
    w.u8(uint8_t(ValueType::kList));
    w.varint(elems.size());
    for (const c10::IValue& e : elems) emit_output(e, w, f);
  } else if (v.isList()) {
    auto list = v.toListRef();
    w.u8(uint8_t(ValueType::kList));
    w.varint(list.size());
    for (const c10::IValue& e : list) emit_output(e, w, f);
  } else {
    // Scalars and other returns: encoded like inputs, through the input byte stack.
    size_t mark = bytes_.size();
    size_t item_mark = items_.size();
    size_t start = bytes_item_start_;
    bytes_item_start_ = mark;
    capture_value(v);
    w.raw(bytes_.data() + mark, bytes_.size() - mark);
    bytes_.resize(mark);
    items_.resize(item_mark);
    bytes_item_start_ = start;
  }
}

void ThreadRecorder::emit_output_tensor(const at::Tensor& t, ByteWriter& w, const Frame& f,
                                        bool scratch) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (f.info->repoints_storage) {
    // set_: the bytes are whatever the new storage holds (a DataLoader worker's batch, a fresh
    // allocation). They are compared where an op reads them; what the cache said is void.
    trace::TensorDesc& desc = desc_scratch_;
    describe_geometry(t, hasher_->length(), &desc);
    desc.bits |= trace::kTensorNotRead;
    cache_.forget(impl);
    write_new(w, desc, -1);
    return;
  }
  const bool cacheable = !impl->is_inference();
  const uint32_t version = tensor_version(t);
  TensorCache::Entry* e = cacheable ? cache_.lookup(t, version, /*allow_external=*/true) : nullptr;
  // A cached description stands for this output only if no kernel can have written it since:
  // never after an `empty`, never for a backend kernel (it writes raw memory), and for a
  // writing op only if a nested op described it after this op began.
  if (e && (e->desc.uninitialized() || !f.info->composite ||
            (f.info->writes && e->written_order < f.order)))
    e = nullptr;
  if (e && e->id >= 0 && next_tensor_id_ - e->id <= int64_t(trace::kRefWindow)) {
    w.u8(uint8_t(ValueType::kTensorRef));
    w.varint(uint64_t(next_tensor_id_ - e->id));
    return;
  }
  if (!e) {
    trace::TensorDesc& desc = desc_scratch_;
    if (captured_into_cuda_graph(t)) {
      // Written at each replay of the graph, not now: its shape says enough (cuda_graphs.h).
      describe_geometry(t, hasher_->length(), &desc);
      desc.bits |= trace::kTensorNotRead;
      cache_.forget(impl);
      cache_.wrote_unseen(t);
      note_written_by_cuda_graph(t);
      write_new(w, desc, -1);
      return;
    }
    std::shared_ptr<const PendingDigest> pending;
    const trace::TensorDesc* known = nullptr;
    TensorCache::StorageState* st = nullptr;
    if (f.info->composite && !f.info->writes && !f.info->returns_uninitialized && !scratch) {
      // A composite op that writes no argument returns what its nested ops described, maybe
      // reshaped (linear's view of its addmm, matmul's _unsafe_view): the same bytes in the same
      // order keep their digest. Not an op with a kernel of its own: addmm's GEMM writes the
      // product over the bias its nested copy_ described.
      st = cache_.storage_of(t);
      if (cache_.bytes_known(st, version) && !in_shared_memory(t) && !written_by_cuda_graph(t))
        known = cache_.described_geometry(st, t, &pending);
    }
    if (known) {
      desc = *known;
      take_geometry(t, &desc);
      // Not a write: the storage's description stays the one its writer made.
      if (!cacheable) {
        write_new(w, desc, st->id, pending);
        return;
      }
      e = &cache_.remember(t, version, desc, std::move(pending));
      e->written_order = f.order;
      e->storage = t.storage().unsafeGetStorageImpl();
      e->storage_writes = st->writes;
      e->base_id = st->id;
      e->id = write_new(w, e->desc, e->base_id, e->pending);
      return;
    }
    if (f.info->returns_uninitialized || scratch) {
      // Uninitialized bytes: their digest would differ run to run and mean nothing.
      describe_geometry(t, hasher_->length(), &desc);
      desc.bits |= trace::kTensorUninitialized;
    } else {
      const bool shared = in_shared_memory(t);
      if (f.known_output && impl == f.known_output_of && t.numel() > 0) {
        // Known from the op's arguments (a fill's value, a copy's source): not read.
        describe_geometry(t, hasher_->length(), &desc);
        pending = f.known_output;
        sink_.totals().bytes_hashed += uint64_t(t.numel()) * uint64_t(t.element_size());
      } else if (impl == f.known_output_of && !shared && t.numel() > 0 &&
                 describe_from_arguments(f, t, &desc, &pending)) {
        // Known from the op's arguments on the CPU too (a copy's source, a fill remembered):
        // described, as the device digest counts them, though not read.
        sink_.totals().bytes_hashed += uint64_t(t.numel()) * uint64_t(t.element_size());
      } else {
        sink_.totals().bytes_hashed += describe_contents(t, &desc, &pending, /*may_wait=*/!shared);
        if (impl == f.known_output_of && !pending) remember_fill(f, desc);
      }
      ++sink_.totals().tensors_hashed;
      if (shared) desc.sharing = trace::Sharing::kSharedMemory;  // this op wrote it
    }
    if (cacheable) {
      e = &cache_.remember(t, version, desc, std::move(pending));
      e->written_order = f.order;
      // Bytes another process or a graph's replay may write next: valid within this op only.
      if (desc.sharing != trace::Sharing::kNone || written_by_cuda_graph(t))
        e->external_serial = top_level_serial_;
    } else {
      write_new(w, desc, -1, pending);
      return;
    }
  }
  e->id = write_new(w, e->desc, e->base_id, e->pending);
  // This op wrote a new version: retire what the cache holds for aliases of its storage.
  // Only the program's own `empty` leaves garbage: a kernel's internal one (mse_loss's) is
  // written by that kernel, unseen, before a nested op reads it.
  cache_.wrote(t, version, *e, !f.program_empty);
  // What this process wrote there is what a later read compares with.
  if (e->desc.sharing != trace::Sharing::kNone) {
    trace::TensorDesc mine = e->desc;
    cache_.note_shared_bytes(cache_.storage_of(t), t, &mine);
  }
}

}  // namespace detaudit::hooks
