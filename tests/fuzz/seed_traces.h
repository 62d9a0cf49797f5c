// Trace seeds written with the trace encoder: every record kind, every value type, every tensor
// field, and ops that the catalog's conditions check. fuzz_make_corpus writes them as files;
// fuzz_catalog evaluates the catalog on catalog_ops().
#pragma once

#include <functional>
#include <map>
#include <string>

#include "trace/records.h"

namespace detaudit::fuzz {

using namespace detaudit::trace;

// A float32 CPU tensor (unless changed) whose digest bytes are all `fill`.
inline TensorDesc tensor(uint8_t fill, std::initializer_list<int64_t> sizes = {4, 4},
                         Dtype dtype = Dtype::kFloat32, Provenance prov = Provenance::kOutput) {
  TensorDesc t;
  t.dtype = dtype;
  t.bits = kTensorContiguous | kTensorHasStats;
  t.set_provenance(prov);
  t.sizes = sizes;
  t.digest_len = 16;
  t.digest.fill(fill);
  t.stats.min = -fill;
  t.stats.max = fill;
  t.stats.mean = fill / 4.0;
  t.stats.l2 = fill * 2.0;
  return t;
}

// Writes one stream record by record, as the recorder does, with strings interned on first use.
class Seed {
 public:
  explicit Seed(DigestAlgo algo = DigestAlgo::kMd5, uint64_t flags = 0, int64_t rank = 0) {
    StreamHeader h;
    h.algo = algo;
    h.flags = flags;
    h.rank = rank;
    h.pid = 4242;
    h.unix_ns = 1700000000000000000ull;
    digest_len_ = digest_length(algo);
    enc_.header(h, &bytes_);
  }
  uint32_t str(const std::string& s) {
    auto [it, added] = strings_.emplace(s, uint32_t(strings_.size()));
    if (added) enc_.string(s, &bytes_);
    return it->second;
  }
  void step(uint64_t step, uint64_t threads = 4, uint32_t det = 0) {
    StepInfo s;
    s.step = step;
    s.order = order_;
    s.rng_cpu = 0x1234 + step;
    s.rng_cuda = 0x5678;
    s.intra_op_threads = threads;
    s.determinism_bits = det;
    enc_.step(s, &bytes_);
  }
  void scope(const std::string& path) {
    uint32_t id = str(path);
    enc_.scope(id, &bytes_);
  }

  // Values of one op: inputs first, then outputs, each a count of top-level values.
  class Values {
   public:
    explicit Values(Seed* s) : s_(s), w_(&bytes_) {}
    Values& tensor(TensorDesc t, int64_t base_id = -1) {
      ++top_;
      w_.u8(uint8_t(ValueType::kTensorNew));
      int64_t id = s_->next_tensor_++;
      t.digest_len = uint8_t(s_->digest_len_);
      write_tensor(w_, t, base_id >= 0 ? uint64_t(id - base_id) : 0);
      last_ = id;
      return *this;
    }
    Values& ref(int64_t id, ValueType type = ValueType::kTensorRef) {
      ++top_;
      w_.u8(uint8_t(type));
      w_.varint(uint64_t(s_->next_tensor_ - id));
      return *this;
    }
    // An input the op writes in full without reading.
    Values& written(int64_t id) { return ref(id, ValueType::kTensorWritten); }
    Values& none() { return type(ValueType::kNone); }
    Values& boolean(bool v) { return type(v ? ValueType::kBoolTrue : ValueType::kBoolFalse); }
    Values& integer(int64_t v) {
      type(ValueType::kInt).w_.zvarint(v);
      return *this;
    }
    Values& real(double v) {
      type(ValueType::kDouble).w_.f64(v);
      return *this;
    }
    Values& string(const std::string& v) { return named(ValueType::kString, v); }
    Values& skipped(const std::string& why) { return named(ValueType::kTensorSkipped, why); }
    Values& other(const std::string& type_name) { return named(ValueType::kOther, type_name); }
    Values& device(uint8_t type, int64_t index) {
      this->type(ValueType::kDevice).w_.u8(type);
      w_.zvarint(index);
      return *this;
    }
    Values& generator(uint64_t digest) {
      type(ValueType::kGenerator).w_.u64(digest);
      return *this;
    }
    Values& ints(std::initializer_list<int64_t> v) {
      type(ValueType::kIntList).w_.varint(v.size());
      for (int64_t x : v) w_.zvarint(x);
      return *this;
    }
    Values& reals(std::initializer_list<double> v) {
      type(ValueType::kDoubleList).w_.varint(v.size());
      for (double x : v) w_.f64(x);
      return *this;
    }
    Values& bools(std::initializer_list<bool> v) {
      type(ValueType::kBoolList).w_.varint(v.size());
      for (bool x : v) w_.u8(x);
      return *this;
    }
    // A list of n values: the next n calls are its elements, not top-level values.
    Values& list(uint64_t n) {
      type(ValueType::kList).w_.varint(n);
      top_ -= n;
      return *this;
    }
    int64_t last() const { return last_; }

   private:
    friend class Seed;
    Values& type(ValueType t) {
      ++top_;
      w_.u8(uint8_t(t));
      return *this;
    }
    Values& named(ValueType t, const std::string& v) {
      uint32_t id = s_->str(v);
      type(t).w_.varint(id);
      return *this;
    }
    Seed* s_;
    std::string bytes_;
    ByteWriter w_;
    uint64_t top_ = 0;
    int64_t last_ = -1;
  };

  // Records an op; `in` and `out` fill its values, in that order (tensor ids count up).
  int64_t op(const std::string& name, const std::function<void(Values&)>& in,
             const std::function<void(Values&)>& out, Phase phase = Phase::kForward,
             uint32_t depth = 0, uint8_t bits = 0, uint64_t rng = 0) {
    uint32_t name_id = str(name);
    Values vi(this), vo(this);
    if (in) in(vi);
    if (out) out(vo);
    OpHead head;
    head.order = order_;
    head.previous_order = last_order_;
    last_order_ = order_++;
    head.name_id = name_id;
    head.bits = uint8_t(uint8_t(phase) | bits);
    head.depth = depth;
    head.seq_nr = int64_t(order_) * 3;
    head.rng = rng;
    ByteWriter& w = enc_.begin_op(head);
    w.varint(vi.top_);
    w.raw(vi.bytes_.data(), vi.bytes_.size());
    w.varint(vo.top_);
    w.raw(vo.bytes_.data(), vo.bytes_.size());
    enc_.finish(&bytes_);
    ++ops_;
    return vo.last_ >= 0 ? vo.last_ : vi.last_;
  }
  // A COLLECTIVE record for the op of program order `op_order`; `received` fills its values.
  void collective(uint64_t op_order, uint64_t seq, uint8_t state,
                  const std::function<void(Values&)>& received) {
    Values v(this);
    received(v);
    CollectiveInfo c;
    c.op_order = op_order;
    c.group = 0;
    c.seq = seq;
    c.group_rank = 1;
    c.group_size = 2;
    c.state = state;
    ByteWriter& w = enc_.begin_collective(c);
    w.varint(v.top_);
    w.raw(v.bytes_.data(), v.bytes_.size());
    enc_.finish(&bytes_);
  }
  uint64_t next_order() const { return order_; }
  void end() {
    EndInfo e;
    e.ops = ops_;
    e.tensors_hashed = uint64_t(next_tensor_);
    e.bytes_hashed = 4096;
    enc_.end(e, &bytes_);
  }
  const std::string& bytes() const { return bytes_; }

 private:
  RecordEncoder enc_;
  std::string bytes_;
  std::map<std::string, uint32_t> strings_;
  size_t digest_len_ = 16;
  uint64_t order_ = 0, last_order_ = 0, ops_ = 0;
  int64_t next_tensor_ = 0;
};

using V = Seed::Values;

// A small training step: forward, backward, optimizer, a random op, a view, an empty tensor.
inline std::string training() {
  Seed s;
  s.step(0);
  int64_t w = s.op(
      "aten::randn",
      [](V& v) {
        v.ints({4, 4}).none().device(0, -1);
      },
      [](V& v) { v.tensor(tensor(1)); }, Phase::kForward, 0, kOpIsRandom | kOpHasRng, 99);
  int64_t x = s.op(
      "aten::empty",
      [](V& v) {
        v.ints({4, 4});
      },
      [](V& v) {
        TensorDesc t = tensor(0);
        t.bits = kTensorContiguous | kTensorUninitialized;
        v.tensor(t);
      });
  int64_t y = s.op(
      "aten::mm",
      [&](V& v) {
        v.ref(w).tensor(tensor(2, {4, 4}, Dtype::kFloat32, Provenance::kExternal));
      },
      [](V& v) { v.tensor(tensor(3)); }, Phase::kForward, 0, kOpHasSeqNr);
  int64_t view = s.op(
      "aten::view", [&](V& v) { v.ref(y).ints({16}); },
      [&](V& v) { v.tensor(tensor(3, {16}, Dtype::kFloat32, Provenance::kView), y); },
      Phase::kForward, 1);
  s.op(
      "aten::add_", [&](V& v) { v.ref(x).ref(view).integer(1); }, [&](V& v) { v.ref(x); });
  s.op(
      "MmBackward0", [&](V& v) { v.tensor(tensor(4)); }, [&](V& v) { v.tensor(tensor(5)).none(); },
      Phase::kBackward, 0, kOpHasSeqNr);
  s.op(
      "aten::add_", [&](V& v) { v.ref(w).tensor(tensor(5)).real(-0.01); }, [&](V& v) { v.ref(w); },
      Phase::kOptimizer);
  s.step(1);
  int64_t z = s.op(
      "aten::mm",
      [&](V& v) {
        v.ref(w).tensor(tensor(7, {4, 4}, Dtype::kFloat32, Provenance::kExternal));
      },
      [](V& v) { v.tensor(tensor(8)); }, Phase::kForward, 0, kOpHasSeqNr);
  s.op(
      "aten::zero_", [&](V& v) { v.written(z); }, [](V& v) { v.tensor(tensor(0)); });
  s.end();
  return s.bytes();
}

// Every value type, strides, integer statistics, NaN and Inf counts, scopes, SHA-256 digests, a
// DataLoader worker's stream.
inline std::string values() {
  Seed s(DigestAlgo::kSha256, kStreamDataLoaderWorker, 1);
  s.step(3, 1, kDetAlgorithms | kDetCudnn);
  s.scope("model/encoder");
  TensorDesc strided = tensor(9, {2, 3}, Dtype::kFloat64, Provenance::kCompiled);
  strided.bits = kTensorHasStats | kTensorHasNanInf |
                 uint8_t(strided.bits & (3u << kProvenanceShift));
  strided.strides = {1, 2};
  strided.stats.nan = 2;
  strided.stats.inf = 1;
  TensorDesc ints = tensor(10, {5}, Dtype::kInt64);
  ints.bits |= kTensorIntStats;
  ints.stats.min = -7;
  ints.stats.max = 1 << 20;
  TensorDesc cuda = tensor(11, {3}, Dtype::kBFloat16);
  cuda.device_type = 1;
  cuda.device_index = 0;
  TensorDesc not_read = tensor(0, {3});
  not_read.bits |= kTensorNotRead;
  s.op(
      "aten::custom",
      [&](V& v) {
        v.tensor(strided)
            .tensor(ints)
            .ints({-1, 0, 1 << 30})
            .reals({0.5, -2.0, 1e300})
            .bools({true, false})
            .string("mean")
            .device(1, 0)
            .generator(0xfeedface)
            .other("torch.memory_format")
            .skipped("quantized");
        v.list(3).tensor(cuda).ref(0).list(2).none().integer(-5);
      },
      [&](V& v) { v.tensor(not_read).list(0); }, Phase::kOther, 2);
  s.scope("");
  s.op(
      "aten::_foreach_add_", [](V& v) { v.list(2).ref(0).ref(1).real(1.0); }, nullptr,
      Phase::kOptimizer, 0, kOpCompiledRegion);
  s.end();
  return s.bytes();
}

// Ops the catalog knows, with the arguments its conditions check (cpu and cuda).
inline std::string catalog_ops() {
  Seed s;
  s.step(0, 4);
  s.op(
      "aten::index_put_",
      [](V& v) {
        v.tensor(tensor(1, {256, 256}))
            .list(1)
            .tensor(tensor(2, {40000}, Dtype::kInt64))
            .tensor(tensor(3, {40000}))
            .boolean(true);
      },
      [](V& v) { v.ref(0); });
  s.op(
      "aten::_index_put_impl_",
      [](V& v) {
        TensorDesc self = tensor(4, {8}, Dtype::kFloat64);
        self.device_type = 1;
        self.device_index = 0;
        v.tensor(self)
            .list(1)
            .tensor(tensor(5, {2}, Dtype::kInt64))
            .tensor(tensor(6, {2}, Dtype::kFloat64))
            .boolean(false)
            .boolean(false);
      },
      [](V& v) { v.ref(3); });
  s.op(
      "aten::scatter_",
      [](V& v) {
        v.tensor(tensor(7)).integer(0).tensor(tensor(8, {4, 4}, Dtype::kInt64)).string("multiply");
      },
      [](V& v) { v.ref(6); });
  s.op(
      "aten::scatter_reduce", [](V& v) { v.ref(0).integer(0).ref(1).ref(2).string("prod"); },
      [](V& v) { v.tensor(tensor(9)); });
  s.op(
      "aten::resize_", [](V& v) { v.skipped("quantized").ints({4}); }, nullptr);
  s.op(
      "aten::bincount", [](V& v) { v.tensor(tensor(10, {6}, Dtype::kInt64)).none().integer(0); },
      [](V& v) { v.tensor(tensor(11, {6}, Dtype::kInt64)); });
  s.op(
      "aten::_embedding_bag_backward",
      [](V& v) {
        for (int i = 0; i < 4; ++i) v.tensor(tensor(uint8_t(12 + i), {4}));
        v.integer(10).boolean(false).integer(0).boolean(false).integer(2);
      },
      [](V& v) {
        v.tensor(tensor(20, {10, 4}));
      },
      Phase::kBackward);
  s.op(
      "IndexSelectBackward0", [](V& v) { v.ref(0); }, [](V& v) { v.tensor(tensor(21)); },
      Phase::kBackward);
  s.op(
      "aten::empty_like", [](V& v) { v.ref(0).none(); },
      [](V& v) {
        TensorDesc t = tensor(0);
        t.bits = kTensorContiguous | kTensorUninitialized;
        v.tensor(t);
      });
  s.op(
      "aten::mm", [](V& v) { v.ref(0).ref(2); }, [](V& v) { v.tensor(tensor(22)); });
  s.end();
  return s.bytes();
}

// Rank 1 of two data-parallel ranks: an all-reduce whose receive buffer arrives in a COLLECTIVE
// record, one completed and one still pending when the stream ended.
inline std::string collectives() {
  Seed s(DigestAlgo::kXxh3, 0, 1);
  s.step(0, 2);
  uint64_t order = s.next_order();
  int64_t grad = s.op(
      "c10d::allreduce_",
      [](V& v) {
        TensorDesc t = tensor(0, {64});
        t.bits |= kTensorNotRead;
        v.list(1).tensor(t).other("ProcessGroup").other("ReduceOp").integer(-1);
      },
      [](V& v) { v.list(1).ref(0).other("Work"); });
  s.collective(order, 1, kCollectiveCompleted, [&](V& v) { v.list(1).tensor(tensor(5, {64})); });
  s.op(
      "aten::add_", [&](V& v) { v.ref(grad).ref(grad).integer(1); }, [&](V& v) { v.ref(grad); },
      Phase::kOptimizer);
  order = s.next_order();
  s.op(
      "c10d::allreduce_", [&](V& v) { v.list(1).ref(grad).other("ProcessGroup"); },
      [&](V& v) { v.list(1).ref(grad); });
  s.collective(order, 2, kCollectiveNotCompleted, [&](V& v) { v.list(1).ref(grad); });
  s.end();
  return s.bytes();
}

}  // namespace detaudit::fuzz
