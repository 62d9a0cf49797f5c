// Test helper: builds real trace files op by op with the trace encoder, and run directories.
//
//   TraceBuilder b;
//   b.step(0);
//   b.op("aten::add").in_new(tensor(1)).in_int(1).out_new(tensor(2)).done();
//   RunDir run("case/run-0");
//   run.add_stream("r0.main.t0", b);
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "trace/records.h"

namespace detaudit::testing {

using trace::ByteWriter;
using trace::Dtype;
using trace::Phase;
using trace::Provenance;
using trace::Scope;
using trace::TensorDesc;
using trace::ValueType;

// A float32 tensor whose digest bytes are all `fill`, with statistics derived from it.
inline TensorDesc tensor(uint8_t fill, std::vector<int64_t> sizes = {4, 4},
                         Provenance prov = Provenance::kOutput, Dtype dtype = Dtype::kFloat32) {
  TensorDesc t;
  t.dtype = dtype;
  t.bits = trace::kTensorContiguous | trace::kTensorHasStats |
           uint8_t(uint8_t(prov) << trace::kProvenanceShift);
  t.sizes.assign(sizes.begin(), sizes.end());
  t.digest_len = 16;
  t.digest.fill(fill);
  t.stats.min = -double(fill);
  t.stats.max = double(fill);
  t.stats.mean = double(fill) / 4;
  t.stats.l2 = double(fill) * 2;
  return t;
}

inline TensorDesc uninitialized(uint8_t fill, std::vector<int64_t> sizes = {4, 4}) {
  TensorDesc t = tensor(fill, std::move(sizes));
  t.bits |= trace::kTensorUninitialized;
  return t;
}

class TraceBuilder {
 public:
  class Op {
   public:
    Op(TraceBuilder* b, std::string name, Phase phase, Scope scope, uint32_t depth, int64_t order)
        : b_(b),
          name_(std::move(name)),
          phase_(phase),
          scope_(scope),
          depth_(depth),
          order_(order) {}
    Op& random(uint64_t rng) {
      bits_ |= trace::kOpIsRandom | trace::kOpHasRng;
      rng_ = rng;
      return *this;
    }
    // Ran with autograd off (torch.no_grad): an evaluation's op.
    Op& grad_off() {
      grad_off_ = true;
      return *this;
    }
    // A torch.compile region (trace::kOpCompiledRegion), as the recorder marks one.
    Op& compiled_region() {
      bits_ |= trace::kOpCompiledRegion;
      return *this;
    }
    // Inputs. A tensor input returns the op so chains read naturally; ids via last_id().
    Op& in_new(const TensorDesc& t, int64_t base_id = -1) { return tensor_new(&in_, t, base_id); }
    Op& in_ref(int64_t id) { return tensor_ref(&in_, id); }
    // An input the op writes in full without reading (an out= buffer, zero_'s self).
    Op& in_written(int64_t id) { return tensor_ref(&in_, id, ValueType::kTensorWritten); }
    Op& in_int(int64_t v) {
      return scalar(&in_, ValueType::kInt, [&](ByteWriter& w) { w.zvarint(v); });
    }
    Op& in_bool(bool v) {
      return scalar(&in_, v ? ValueType::kBoolTrue : ValueType::kBoolFalse, nullptr);
    }
    Op& in_none() { return scalar(&in_, ValueType::kNone, nullptr); }
    // A tensor the recorder did not hash, with its reason ("quantized").
    Op& in_skipped(const std::string& reason) {
      uint32_t id = b_->intern(reason);
      return scalar(&in_, ValueType::kTensorSkipped, [id](ByteWriter& w) { w.varint(id); });
    }
    Op& in_string(const std::string& s) {
      uint32_t id = b_->intern(s);
      return scalar(&in_, ValueType::kString, [id](ByteWriter& w) { w.varint(id); });
    }
    Op& in_double(double v) {
      return scalar(&in_, ValueType::kDouble, [&](ByteWriter& w) { w.f64(v); });
    }
    Op& in_list(uint64_t n) { return list(&in_, n); }
    Op& out_list(uint64_t n) { return list(&out_, n); }
    Op& out_new(const TensorDesc& t, int64_t base_id = -1) { return tensor_new(&out_, t, base_id); }
    Op& out_ref(int64_t id) { return tensor_ref(&out_, id); }
    // The written section: an argument the op wrote and did not return (BatchNorm's
    // running_mean), as it was after the op.
    Op& written_new(const std::string& argument, const TensorDesc& t) {
      const uint32_t name = b_->intern(argument);
      ByteWriter(&written_.bytes).varint(name);
      ++written_args_;
      Values one;
      tensor_new(&one, t, -1);
      written_.bytes += one.bytes;
      return *this;
    }
    // A scalar return (aten::item's).
    Op& out_double(double v) {
      return scalar(&out_, ValueType::kDouble, [&](ByteWriter& w) { w.f64(v); });
    }
    int64_t last_id() const { return last_id_; }
    // Writes the op record; returns the id of the last tensor it created.
    int64_t done();

   private:
    struct Values {
      std::string bytes;
      uint64_t top = 0, list_left = 0;
    };
    // A list of the next n values.
    Op& list(Values* v, uint64_t n) {
      count(v);
      ByteWriter(&v->bytes).u8(uint8_t(ValueType::kList));
      ByteWriter(&v->bytes).varint(n);
      v->list_left = n;
      return *this;
    }
    void count(Values* v) {
      if (v->list_left)
        --v->list_left;
      else
        ++v->top;
    }
    template <typename F>
    Op& scalar(Values* v, ValueType type, F f) {
      count(v);
      ByteWriter w(&v->bytes);
      w.u8(uint8_t(type));
      if constexpr (!std::is_same_v<F, std::nullptr_t>) f(w);
      return *this;
    }
    Op& tensor_new(Values* v, const TensorDesc& t, int64_t base_id) {
      count(v);
      ByteWriter w(&v->bytes);
      if (t.sharing != trace::Sharing::kNone) {  // as the recorder writes it
        w.u8(uint8_t(ValueType::kTensorNewShared));
        w.u8(uint8_t(t.sharing));
      } else {
        w.u8(uint8_t(ValueType::kTensorNew));
      }
      int64_t id = b_->next_tensor_++;
      trace::write_tensor(w, t, base_id >= 0 ? uint64_t(id - base_id) : 0);
      last_id_ = id;
      return *this;
    }
    Op& tensor_ref(Values* v, int64_t id, ValueType type = ValueType::kTensorRef) {
      count(v);
      ByteWriter w(&v->bytes);
      w.u8(uint8_t(type));
      w.varint(uint64_t(b_->next_tensor_ - id));
      return *this;
    }
    TraceBuilder* b_;
    std::string name_;
    Phase phase_;
    Scope scope_;
    uint32_t depth_;
    int64_t order_;
    uint8_t bits_ = 0;
    uint64_t rng_ = 0;
    bool grad_off_ = false;
    Values in_, out_, written_;
    uint64_t written_args_ = 0;
    int64_t last_id_ = -1;
  };

  explicit TraceBuilder(int64_t rank = 0, std::string role = "main", std::string thread = "main",
                        trace::DigestAlgo algo = trace::DigestAlgo::kMd5) {
    trace::StreamHeader h;
    h.algo = algo;
    h.rank = rank;
    h.process_role = std::move(role);
    h.thread = std::move(thread);
    h.pid = 1000;
    enc_.header(h, &bytes_);
  }

  void step(uint64_t step, uint64_t rng_cpu = 7, uint64_t threads = 2, uint32_t det = 0) {
    trace::StepInfo s;
    s.step = step;
    s.order = next_order_;
    s.rng_cpu = rng_cpu;
    s.intra_op_threads = threads;
    s.determinism_bits = det;
    enc_.step(s, &bytes_);
  }

  // An op at `depth`; order defaults to the next program order (give it for nested ops, whose
  // records come inner-first but whose orders count from the outer op).
  Op op(std::string name, Phase phase = Phase::kForward, uint32_t depth = 0, int64_t order = -1,
        Scope scope = Scope::kFunction) {
    return Op(this, std::move(name), phase, scope, depth, order);
  }
  uint64_t reserve_orders(uint64_t n) {
    uint64_t first = next_order_;
    next_order_ += n;
    return first;
  }
  int64_t next_tensor() const { return next_tensor_; }

  // A COLLECTIVE record for the op of program order `op_order`: its receive buffers' contents,
  // new tensors as the recorder writes them once the Work completed.
  void collective(uint64_t op_order, uint64_t seq, const std::vector<TensorDesc>& received) {
    trace::CollectiveInfo c;
    c.op_order = op_order;
    c.seq = seq;
    c.group_size = 2;
    ByteWriter& w = enc_.begin_collective(c);
    w.varint(received.size());
    for (const TensorDesc& t : received) {
      w.u8(uint8_t(ValueType::kTensorNew));
      trace::write_tensor(w, t, 0);
      ++next_tensor_;
    }
    enc_.finish(&bytes_);
  }

  void end() {
    trace::EndInfo e;
    e.ops = ops_;
    enc_.end(e, &bytes_);
  }
  // The END a signal's save writes (hooks' ThreadRecorder::close_for_signal).
  void end_by_signal(int sig, uint64_t bits = trace::kEndThreadKnown,
                     const std::string& open_op = "") {
    trace::EndInfo e;
    e.ops = ops_;
    e.signal = sig;
    e.ending_bits = bits | (open_op.empty() ? 0 : trace::kEndInsideOp);
    e.open_op = open_op;
    enc_.end(e, &bytes_);
  }
  const std::string& bytes() const { return bytes_; }

 private:
  friend class Op;
  uint32_t intern(const std::string& s) {
    auto it = strings_.find(s);
    if (it != strings_.end()) return it->second;
    enc_.string(s, &bytes_);
    uint32_t id = uint32_t(strings_.size());
    strings_[s] = id;
    return id;
  }

  trace::RecordEncoder enc_;
  std::string bytes_;
  std::map<std::string, uint32_t> strings_;
  uint64_t next_order_ = 0, last_order_ = 0, ops_ = 0;
  int64_t next_tensor_ = 0;
};

inline int64_t TraceBuilder::Op::done() {
  uint32_t name = b_->intern(name_);
  uint64_t order = order_ >= 0 ? uint64_t(order_) : b_->next_order_++;
  if (order >= b_->next_order_) b_->next_order_ = order + 1;
  // The recorder's own head encoding: every trace a test builds is read as a recorded one is.
  trace::OpHead head;
  head.order = order;
  head.previous_order = b_->last_order_;
  head.name_id = name;
  head.bits = uint8_t(uint8_t(phase_) | uint8_t(uint8_t(scope_) << 2) | bits_);
  head.depth = depth_;
  head.grad_off = grad_off_;
  head.rng = rng_;
  ByteWriter& w = b_->enc_.begin_op(head);
  b_->last_order_ = order;
  w.varint(in_.top);
  w.raw(in_.bytes.data(), in_.bytes.size());
  w.varint(out_.top);
  w.raw(out_.bytes.data(), out_.bytes.size());
  if (written_args_) {
    w.varint(written_args_);
    w.raw(written_.bytes.data(), written_.bytes.size());
  }
  b_->enc_.finish(&b_->bytes_);
  ++b_->ops_;
  return last_id_;
}

// A run directory under the test temp dir, its own for each test: ctest runs a suite's tests as
// processes side by side, so a name shared by two tests must not be one directory.
// <tmp>/detaudit_<Suite.Test>/<name>/streams/...
inline std::string test_scratch_dir() {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string dir = std::string(::testing::TempDir()) + "/detaudit_";
  if (test) dir += std::string(test->test_suite_name()) + "." + test->name();
  return dir;
}

class RunDir {
 public:
  explicit RunDir(const std::string& name) : path_(test_scratch_dir() + "/" + name) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_ + "/streams");
  }
  const std::string& path() const { return path_; }
  std::string stream_path(const std::string& stream) const {
    return path_ + "/streams/" + stream + ".dtr";
  }
  void add_stream(const std::string& stream, const TraceBuilder& b) {
    write(stream_path(stream), b.bytes());
  }
  void add_bytes(const std::string& stream, const std::string& bytes) {
    write(stream_path(stream), bytes);
  }
  void env(const std::string& process, const nlohmann::json& j) {
    write(path_ + "/streams/" + process + ".env.json", j.dump());
  }
  static void write(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << bytes;
  }

 private:
  std::string path_;
};

// A fingerprint like the recorder's, with the given intra-op thread count.
inline nlohmann::json sample_env(int threads, int pid) {
  return {{"torch_version", "1.13.0a0"},
          {"intra_op_threads", threads},
          {"inter_op_threads", 2},
          {"determinism",
           {{"deterministic_algorithms", false},
            {"warn_only", false},
            {"benchmark_cudnn", false},
            {"allow_tf32_cudnn", true}}},
          {"env", {{"OMP_NUM_THREADS", std::to_string(threads)}, {"PYTHONHASHSEED", nullptr}}},
          {"cuda", {{"available", false}}},
          {"pid", pid},
          {"rank", 0},
          {"world_size", 1},
          {"process_role", "main"}};
}

}  // namespace detaudit::testing
