// Sums what a run directory's traces hold: ops, tensor records, bytes, bytes hashed, steps.
// Prints one JSON line; used by tests/bench/bench.py.
#include <cstdio>
#include <filesystem>
#include <set>

#include "trace/reader.h"

int main(int argc, char** argv) {
  using namespace detaudit::trace;
  if (argc != 2) {
    std::fprintf(stderr, "usage: bench_trace_stats RUN_DIR\n");
    return 2;
  }
  uint64_t ops = 0, tensor_values = 0, file_bytes = 0, bytes_hashed = 0, tensors_hashed = 0;
  std::set<uint64_t> steps;
  for (const auto& e : std::filesystem::directory_iterator(std::string(argv[1]) + "/streams")) {
    if (e.path().extension() != ".dtr") continue;
    TraceReader r;
    if (!r.open(e.path().string()).ok()) return 3;
    while (r.next() == ReadResult::kRecord) {
      if (r.kind() == RecordKind::kOp) {
        ++ops;
        tensor_values += r.op().input_tensors.size() + r.op().output_tensors.size();
      } else if (r.kind() == RecordKind::kStep) {
        steps.insert(r.step().step);
      }
    }
    file_bytes += r.bytes_read();
    bytes_hashed += r.end_info().bytes_hashed;
    tensors_hashed += r.end_info().tensors_hashed;
  }
  std::printf(
      "{\"ops\": %llu, \"tensor_records\": %llu, \"trace_bytes\": %llu, \"bytes_hashed\": %llu, "
      "\"tensors_hashed\": %llu, \"steps\": %zu}\n",
      (unsigned long long)ops, (unsigned long long)tensor_values, (unsigned long long)file_bytes,
      (unsigned long long)bytes_hashed, (unsigned long long)tensors_hashed, steps.size());
}
