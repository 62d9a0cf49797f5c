#include "capture/op_capture.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tensors/tensor_copy.h"

namespace detaudit::hooks {
namespace {

std::atomic<bool> g_done{false};

bool write_file(const std::string& path, const char* data, size_t n) {
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  out.write(data, std::streamsize(n));
  out.close();
  return out && std::rename(tmp.c_str(), path.c_str()) == 0;
}

void write_result(const CaptureSpec& spec, const nlohmann::json& j) {
  const std::string text = j.dump(2) + "\n";
  write_file(spec.dir + "/capture.json", text.data(), text.size());
}

CaptureSpec* load_spec() {
  const char* path = std::getenv("DETAUDIT_CAPTURE");
  if (!path || !*path) return nullptr;
  try {
    std::ifstream in(path);
    nlohmann::json j = nlohmann::json::parse(in);
    auto* spec = new CaptureSpec;
    spec->process = j.at("process").get<std::string>();
    spec->thread = j.at("thread").get<std::string>();
    spec->op = j.at("op").get<std::string>();
    spec->occurrence = j.at("occurrence").get<uint64_t>();
    spec->inputs = j.at("inputs").get<std::vector<std::string>>();
    spec->dir = j.at("dir").get<std::string>();
    return spec;
  } catch (const std::exception&) {
    return nullptr;  // the CLI wrote it; it finds no capture.json and says the spec was unread
  }
}

}  // namespace

const CaptureSpec* capture_spec() {
  static const CaptureSpec* spec = load_spec();
  return spec;
}

bool capture_done() { return g_done.load(std::memory_order_relaxed); }

void capture_op(const CaptureSpec& spec, const at::RecordFunction& fn,
                const std::vector<std::string>& digests) {
  if (g_done.exchange(true)) return;
  nlohmann::json j = {{"op", spec.op}, {"occurrence", spec.occurrence}};
  try {
    const auto name = fn.operator_name();
    j["overload"] = name ? name->overload_name : "";
    // The program took another path if the op read other bytes than the recorded one.
    std::vector<nlohmann::json> differing;
    if (digests.size() != spec.inputs.size()) {
      j["status"] = "other-path";
      j["why"] = "the op has " + std::to_string(digests.size()) + " tensor inputs, the record " +
                 std::to_string(spec.inputs.size());
      write_result(spec, j);
      return;
    }
    for (size_t i = 0; i < digests.size(); ++i)
      if (!spec.inputs[i].empty() && !digests[i].empty() && digests[i] != spec.inputs[i])
        differing.push_back({{"input", i}, {"recorded", spec.inputs[i]}, {"now", digests[i]}});
    if (!differing.empty()) {
      j["status"] = "other-path";
      j["why"] = "its inputs differ from the record's";
      j["differing_inputs"] = differing;
      write_result(spec, j);
      return;
    }
    std::vector<c10::IValue> args;
    std::vector<int> compacted;
    for (const c10::IValue& v : fn.inputs()) {
      if (v.isGenerator()) {
        j["status"] = "unsupported";
        j["why"] =
            "the op takes a generator, which cannot be saved: a random op's outputs follow "
            "its generator's state (the rng-state class), not a kernel's order";
        write_result(spec, j);
        return;
      }
      // The bytes as the op received them, where they lay, not a later version of the tensor.
      bool compact = false;
      args.push_back(v.isTensor() && v.toTensor().defined()
                         ? c10::IValue(copy_with_layout(v.toTensor(), &compact))
                         : v);
      if (compact) compacted.push_back(int(args.size()) - 1);
    }
    if (!compacted.empty()) j["compacted"] = compacted;
    const std::vector<char> bytes = torch::jit::pickle_save(
        c10::ivalue::Tuple::create(std::move(args)));
    if (!write_file(spec.dir + "/inputs.pt", bytes.data(), bytes.size())) {
      j["status"] = "error";
      j["why"] = "cannot write " + spec.dir + "/inputs.pt";
    } else {
      j["status"] = "saved";
      j["inputs_file"] = spec.dir + "/inputs.pt";
    }
  } catch (const std::exception& e) {
    j["status"] = "unsupported";
    j["why"] = std::string("its inputs cannot be saved: ") + e.what();
  }
  write_result(spec, j);
}

}  // namespace detaudit::hooks
