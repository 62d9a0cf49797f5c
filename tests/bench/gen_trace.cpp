// Writes two synthetic run directories of N ops each (a training-like mix of nested forward,
// backward and optimizer ops; run B differs in one op near the end), for timing `detaudit diff`
// by hand:
//   built as build/bin/bench_gen_trace; tests/bench/run.sh uses it for the diff figures
//   bench_gen_trace /tmp/bench 10000000 && detaudit diff /tmp/bench/run-0 /tmp/bench/run-1
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "trace/records.h"

using namespace detaudit::trace;

namespace {

TensorDesc make_tensor(uint64_t fill, bool external) {
  TensorDesc t;
  t.dtype = 6;
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

void write_run(const std::string& dir, uint64_t n_ops, bool b) {
  std::filesystem::create_directories(dir + "/streams");
  std::FILE* f = std::fopen((dir + "/streams/r0.main.t-main.dtr").c_str(), "wb");
  RecordEncoder enc;
  std::string out;
  StreamHeader h;
  enc.header(h, &out);
  const char* names[] = {"aten::linear",   "aten::addmm", "aten::relu",
                         "AddmmBackward0", "aten::mm",    "aten::add_"};
  for (const char* n : names) enc.string(n, &out);
  uint64_t order = 0, last_order = 0, ops = 0, next_tensor = 0;
  for (uint64_t step = 0; ops < n_ops; ++step) {
    StepInfo s;
    s.step = step;
    s.order = order;
    s.intra_op_threads = 2;
    enc.step(s, &out);
    for (int k = 0; k < 100 && ops < n_ops; ++k) {
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
        w.u8(uint8_t(ValueType::kTensorNew));
        write_tensor(w, make_tensor(ops * 3 + 1, g.off == 1), 0);
        ++next_tensor;
        w.u8(uint8_t(ValueType::kTensorRef));
        w.varint(1);
        w.varint(1);
        bool flip = b && ops == n_ops - 10;
        w.u8(uint8_t(ValueType::kTensorNew));
        write_tensor(w, make_tensor(ops * 3 + 2 + (flip ? 7 : 0), false), 0);
        ++next_tensor;
        enc.finish(&out);
        ++ops;
      }
      order += 6;
      if (out.size() > (8u << 20)) {
        std::fwrite(out.data(), 1, out.size(), f);
        out.clear();
      }
    }
  }
  EndInfo e;
  e.ops = ops;
  enc.end(e, &out);
  std::fwrite(out.data(), 1, out.size(), f);
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: gen_trace OUT_DIR N_OPS\n");
    return 2;
  }
  uint64_t n = std::strtoull(argv[2], nullptr, 10);
  write_run(std::string(argv[1]) + "/run-0", n, false);
  write_run(std::string(argv[1]) + "/run-1", n, true);
  std::printf("wrote %llu ops per run under %s\n", (unsigned long long)n, argv[1]);
  return 0;
}
