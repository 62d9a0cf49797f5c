// Writes the trace seeds of corpus/fuzz_trace_reader/ (seed_traces.h), in the trace format this
// build writes: tests/fuzz/run.sh runs it before fuzzing, so the seeds follow format changes.
//   build-san/bin/fuzz_make_corpus tests/fuzz/corpus/fuzz_trace_reader
#include <cstdio>
#include <fstream>
#include <string>

#include "seed_traces.h"

namespace {

void save(const std::string& dir, const std::string& name, const std::string& bytes) {
  std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  std::printf("%s: %zu bytes\n", path.c_str(), bytes.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_corpus <dir>\n");
    return 2;
  }
  std::string dir = argv[1];
  save(dir, "training.dtr", detaudit::fuzz::training());
  save(dir, "values.dtr", detaudit::fuzz::values());
  save(dir, "catalog_ops.dtr", detaudit::fuzz::catalog_ops());
  save(dir, "collectives.dtr", detaudit::fuzz::collectives());
  // Killed mid-record: the reader's cut-short path.
  std::string cut = detaudit::fuzz::training();
  save(dir, "cut_short.dtr", cut.substr(0, cut.size() - 9));
  return 0;
}
