// libFuzzer harness: a config file (docs/config.md) as `run --config` loads it. A config that
// loads must survive the trip through config_to_json, the resolved file the interposer reads:
// parsed again it gives the same JSON.
#include <string>

#include "config/config.h"
#include "fuzz_util.h"

using namespace detaudit;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = fuzz::scratch_dir() + "/config.json";
  fuzz::write_file(path, std::string(reinterpret_cast<const char*>(data), size));
  Config c;
  if (!load_config(path, &c).ok()) return 0;

  nlohmann::json resolved = config_to_json(c);
  std::string text = resolved.dump();
  Config again;
  if (Status s = parse_config(nlohmann::json::parse(text), &again); !s.ok())
    fuzz::die("the resolved config does not parse: " + s.message() + "\n" + text);
  if (config_to_json(again) != resolved)
    fuzz::die("the resolved config changes when parsed again:\n" + text);

  // What the interposer asks of the selection, on every op and step.
  for (const char* op : {"aten::add", "aten::index_put_", "", "*"}) c.select.wants_op(op);
  for (uint64_t v : {uint64_t(0), uint64_t(3), UINT64_MAX}) {
    c.select.steps.contains(v);
    c.select.ranks.contains(v);
  }
  c.select.steps.max_bound();
  c.select.wants_phase(trace::Phase::kBackward);
  return 0;
}
