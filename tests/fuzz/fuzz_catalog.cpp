// libFuzzer harness: a catalog file (docs/catalog.md) as the CLI loads it, then every use of a
// loaded catalog: lookups, search, its JSON, and each entry's conditions checked against the
// recorded ops of seed_traces.h's catalog_ops() (tensors, lists, None, bools, ints, strings, a
// skipped quantized tensor, cpu and cuda).
#include <algorithm>
#include <string>
#include <vector>

#include "catalog/catalog.h"
#include "fuzz_util.h"
#include "seed_traces.h"

using namespace detaudit;

namespace {

struct RecordedOps {
  trace::TraceReader reader;  // holds the ops' strings and tensors
  std::vector<trace::OpRecord> ops;
};

const RecordedOps& recorded() {
  static RecordedOps* r = [] {
    auto* r = new RecordedOps;
    const std::string path = fuzz::scratch_dir() + "/catalog_ops.dtr";
    fuzz::write_file(path, fuzz::catalog_ops());
    if (Status s = r->reader.open(path); !s.ok()) fuzz::die(s.message());
    while (r->reader.next() == trace::ReadResult::kRecord)
      if (r->reader.kind() == trace::RecordKind::kOp) r->ops.push_back(r->reader.op());
    if (r->ops.empty()) fuzz::die(path + ": no ops");
    return r;
  }();
  return *r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = fuzz::scratch_dir() + "/catalog.json";
  const RecordedOps& rec = recorded();
  fuzz::write_file(path, std::string(reinterpret_cast<const char*>(data), size));
  Catalog c;
  if (!Catalog::load(path, &c).ok()) return 0;

  c.search("");
  c.search("index_put");
  for (const CatalogEntry& e : c.entries()) {
    if (c.find(e.id) == nullptr) fuzz::die("entry " + e.id + " is not found by its id");
    entry_to_json(e).dump();
    // As each of its op names (a few), and as whatever the recorded ops are called.
    std::vector<std::string_view> names(e.ops.begin(),
                                        e.ops.begin() + std::min<size_t>(e.ops.size(), 4));
    names.push_back("");
    for (std::string_view name : names) {
      c.lookup(name);
      for (const trace::OpRecord& op : rec.ops)
        for (uint64_t threads : {0, 1, 8}) evaluate(e, OpFacts{name, &op, &rec.reader, threads});
    }
    for (const trace::OpRecord& op : rec.ops)
      evaluate(e, OpFacts{rec.reader.string(op.name), &op, &rec.reader, 4});
  }
  for (const trace::OpRecord& op : rec.ops) {
    std::string_view name = rec.reader.string(op.name);
    explain_chain(c, {OpFacts{name, &op, &rec.reader, 4}, OpFacts{name, nullptr, nullptr, 0}});
  }
  return 0;
}
