// Writes two synthetic run directories for timing `detaudit diff`: a training-like mix of nested
// forward, backward and optimizer ops, N a rank.
//   bench_gen_trace OUT N_OPS                  one rank; run B differs in one op near the end
//   bench_gen_trace OUT N_OPS RANKS [ORIGIN]   RANKS ranks, an all-reduce ending each step; in
//       run B, rank ORIGIN (default RANKS / 2) gives one optimizer write a different result in
//       the middle step (its replicas disagree), and the step's all-reduce, which reads it,
//       carries the difference to every rank from there on
// built as build/bin/bench_gen_trace; tests/bench/bench.py and scale_diff.py run it:
//   bench_gen_trace /tmp/bench 10000000 && detaudit diff /tmp/bench/run-0 /tmp/bench/run-1
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "trace/records.h"

using namespace detaudit::trace;

namespace {

constexpr int kGroupsPerStep = 100;  // each 6 ops

TensorDesc make_tensor(uint64_t fill, bool external) {
  TensorDesc t;
  t.dtype = Dtype::kFloat32;
  t.bits = kTensorContiguous | kTensorHasStats | uint8_t((external ? 1 : 0) << kProvenanceShift);
  t.sizes = {32, 64};
  t.digest_len = 16;
  for (int i = 0; i < 16; ++i) t.digest[i] = uint8_t(fill >> (8 * (i % 8)));
  t.stats.min = -1;
  t.stats.max = 1;
  t.stats.mean = double(fill % 100) / 100;
  t.stats.l2 = 3;
  return t;
}

struct Shape {
  uint64_t n_ops = 0;
  int64_t ranks = 1;   // 1: no collectives
  int64_t origin = 0;  // the rank whose op differs in run B
};

// One rank's main thread. Run B's difference: one op's output (one rank) near the end, or, with
// several ranks, the last op of the middle step on `origin`, which the step's all-reduce reads.
void write_stream(const std::string& dir, const Shape& shape, int64_t rank, bool b) {
  const std::string name = "r" + std::to_string(rank) + ".main";
  std::FILE* f = std::fopen((dir + "/streams/" + name + ".t-main.dtr").c_str(), "wb");
  RecordEncoder enc;
  std::string out;
  StreamHeader h;
  h.rank = rank;
  enc.header(h, &out);
  const char* names[] = {"aten::linear", "aten::addmm", "aten::relu",      "AddmmBackward0",
                         "aten::mm",     "aten::add_",  "c10d::allreduce_"};
  for (const char* n : names) enc.string(n, &out);
  const bool collectives = shape.ranks > 1;
  const uint64_t ops_per_step = kGroupsPerStep * 6 + (collectives ? 1 : 0);
  const uint64_t steps = (shape.n_ops + ops_per_step - 1) / ops_per_step;
  const uint64_t middle = steps / 2;
  const uint64_t rank_salt = uint64_t(rank) << 40;
  uint64_t order = 0, last_order = 0, ops = 0, seq = 0;
  for (uint64_t step = 0; ops < shape.n_ops; ++step) {
    StepInfo s;
    s.step = step;
    s.order = order;
    s.intra_op_threads = 2;
    enc.step(s, &out);
    for (int k = 0; k < kGroupsPerStep && ops < shape.n_ops; ++k) {
      // name, depth, phase, order offset within a group of 6 (linear > addmm first).
      static const struct {
        int name, depth, phase, off;
      } kGroup[] = {{1, 1, 0, 1}, {0, 0, 0, 0}, {2, 0, 0, 2},
                    {4, 1, 1, 4}, {3, 0, 1, 3}, {5, 0, 2, 5}};
      for (const auto& g : kGroup) {
        uint64_t o = order + uint64_t(g.off);
        ByteWriter& w = enc.begin(RecordKind::kOp);
        w.zvarint(int64_t(o) - int64_t(last_order));
        last_order = o;
        w.varint(uint64_t(g.name));
        w.u8(uint8_t(g.phase));
        w.varint(uint64_t(g.depth));
        w.varint(2);
        // The optimizer's writes are the same on every rank: data-parallel replicas.
        const uint64_t salt = g.phase == 2 ? 0 : rank_salt;
        w.u8(uint8_t(ValueType::kTensorNew));
        write_tensor(w, make_tensor(salt + ops * 3 + 1, g.off == 1), 0);
        w.u8(uint8_t(ValueType::kTensorRef));
        w.varint(1);
        w.varint(1);
        const bool flip = b && (collectives ? rank == shape.origin && step == middle &&
                                                  k == kGroupsPerStep - 1 && g.off == 5
                                            : ops == shape.n_ops - 10);
        w.u8(uint8_t(ValueType::kTensorNew));
        write_tensor(w, make_tensor(salt + ops * 3 + 2 + (flip ? 7 : 0), false), 0);
        enc.finish(&out);
        ++ops;
      }
      order += 6;
      if (out.size() > (8u << 20)) {
        std::fwrite(out.data(), 1, out.size(), f);
        out.clear();
      }
    }
    if (!collectives || ops >= shape.n_ops) continue;
    // The step's all-reduce of what its last op made: every rank receives the same sum, which
    // run B's difference changes from the middle step on.
    ByteWriter& w = enc.begin(RecordKind::kOp);
    w.zvarint(int64_t(order) - int64_t(last_order));
    last_order = order;
    w.varint(6);
    w.u8(1);  // backward
    w.varint(0);
    w.varint(1);
    w.u8(uint8_t(ValueType::kTensorRef));
    w.varint(1);
    w.varint(0);
    enc.finish(&out);
    CollectiveInfo c;
    c.op_order = order;
    c.seq = ++seq;
    c.group_rank = rank;
    c.group_size = uint64_t(shape.ranks);
    ByteWriter& cw = enc.begin_collective(c);
    cw.varint(1);
    cw.u8(uint8_t(ValueType::kTensorNew));
    write_tensor(
        cw, make_tensor((uint64_t(1) << 60) + step + (b && step >= middle ? 11 : 0), false), 0);
    enc.finish(&out);
    ++ops;
    ++order;
  }
  EndInfo e;
  e.ops = ops;
  enc.end(e, &out);
  std::fwrite(out.data(), 1, out.size(), f);
  std::fclose(f);
  // The fingerprint the diff reads each rank's world from.
  std::ofstream(dir + "/streams/" + name + ".env.json")
      << "{\"rank\": " << rank << ", \"world_size\": " << shape.ranks
      << ", \"process_role\": \"main\", \"intra_op_threads\": 2}\n";
}

void write_run(const std::string& dir, const Shape& shape, bool b) {
  std::filesystem::create_directories(dir + "/streams");
  for (int64_t r = 0; r < shape.ranks; ++r) write_stream(dir, shape, r, b);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: gen_trace OUT_DIR N_OPS [RANKS [ORIGIN_RANK]]\n");
    return 2;
  }
  Shape shape;
  shape.n_ops = std::strtoull(argv[2], nullptr, 10);
  shape.ranks = argc > 3 ? std::strtoll(argv[3], nullptr, 10) : 1;
  shape.origin = argc > 4 ? std::strtoll(argv[4], nullptr, 10) : shape.ranks / 2;
  if (shape.ranks < 1 || shape.origin < 0 || shape.origin >= shape.ranks) {
    std::fprintf(stderr, "gen_trace: RANKS must be >= 1 and ORIGIN_RANK below it\n");
    return 2;
  }
  write_run(std::string(argv[1]) + "/run-0", shape, false);
  write_run(std::string(argv[1]) + "/run-1", shape, true);
  std::printf("wrote %llu ops a rank, %lld rank(s), per run under %s\n",
              (unsigned long long)shape.n_ops, (long long)shape.ranks, argv[1]);
  return 0;
}
