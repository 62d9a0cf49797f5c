// libFuzzer harness: a trace file read as every verb reads one. The input becomes the only
// stream of a run directory, which `show` (summary), `export` (JSON Lines and the timeline), the
// single run's risk report (the catalog's conditions on each op) and `show --step` then read.
//
// Each framed record's CRC-32C is recomputed first: without that nearly every mutation would
// stop at the checksum and never reach the decoder. Bytes after the last whole record are left
// as they are (a cut-short file).
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "catalog/catalog.h"
#include "diff/risk.h"
#include "fuzz_util.h"
#include "summary/summary.h"
#include "summary/timeline.h"
#include "trace/bytes.h"

using namespace detaudit;

namespace {

void fix_checksums(std::string* bytes) {
  size_t pos = 0;
  while (pos < bytes->size()) {
    uint64_t length = 0;
    size_t n = 0;
    bool whole = false;
    for (int shift = 0; shift < 64 && pos + n < bytes->size(); shift += 7) {
      uint8_t b = uint8_t((*bytes)[pos + n++]);
      length |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) {
        whole = true;
        break;
      }
    }
    size_t left = bytes->size() - pos - n;
    if (!whole || length == 0 || length > left || left - length < 4) return;
    uint32_t crc = trace::crc32c(0, bytes->data() + pos + n, length);
    std::memcpy(&(*bytes)[pos + n + length], &crc, 4);
    pos += n + length + 4;
  }
}

const Catalog& catalog() {
  static const Catalog c = [] {
    Catalog c;
    if (Status s = Catalog::load(DETAUDIT_SOURCE_DIR "/configs/catalog.json", &c); !s.ok())
      fuzz::die(s.message());
    return c;
  }();
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string run = fuzz::scratch_dir() + "/run";
  static const std::string trace = [] {
    std::filesystem::create_directories(run + "/streams");
    return run + "/streams/r0.main.t-main.dtr";
  }();
  std::string bytes(reinterpret_cast<const char*>(data), size);
  fix_checksums(&bytes);
  fuzz::write_file(trace, bytes);

  summary::RunSummary s;
  if (!summary::summarize_run(run, "", &s).ok()) return 0;  // not even a header
  summary::top_ops(s, 5);
  std::ostringstream out;
  std::vector<std::string> notes;
  summary::export_run(run, "", out, &notes);
  out.str("");
  summary::write_timeline(run, nullptr, out);
  RiskReport risk;
  if (risk_report(run, catalog(), &risk).ok()) {
    render_risk_report(risk, false);
    risk_report_to_json(risk).dump();
  }
  uint64_t step = s.streams.empty() ? 0 : s.streams[0].first_step;
  summary::for_each_step_op(trace, step, [](const summary::OpLine&) {});
  return 0;
}
