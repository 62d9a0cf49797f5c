#include "capture/op_capture.h"

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "tensors/tensor_copy.h"

namespace detaudit::hooks {
namespace {

bool write_file(const std::string& path, const char* data, size_t n) {
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  out.write(data, std::streamsize(n));
  out.close();
  return out && std::rename(tmp.c_str(), path.c_str()) == 0;
}

void write_result(const CaptureTarget& t, const nlohmann::json& j) {
  const std::string text = j.dump(2) + "\n";
  write_file(t.dir + "/capture.json", text.data(), text.size());
}

CaptureTarget parse_target(const nlohmann::json& j) {
  CaptureTarget t;
  t.process = j.at("process").get<std::string>();
  t.thread = j.at("thread").get<std::string>();
  t.op = j.at("op").get<std::string>();
  t.occurrence = j.at("occurrence").get<uint64_t>();
  t.dir = j.at("dir").get<std::string>();
  if (j.contains("plant")) {
    const nlohmann::json& p = j["plant"];
    t.plant = true;
    t.plant_input = p.value("value", std::string("output")) == "input";
    t.relative = p.value("relative", 1e-3);
    return t;
  }
  t.inputs = j.at("inputs").get<std::vector<std::string>>();
  return t;
}

CaptureSpec* load_spec() {
  const char* path = std::getenv("DETAUDIT_CAPTURE");
  if (!path || !*path) return nullptr;
  try {
    std::ifstream in(path);
    nlohmann::json j = nlohmann::json::parse(in);
    auto* spec = new CaptureSpec;
    if (j.contains("targets"))
      for (const nlohmann::json& t : j["targets"]) spec->targets.push_back(parse_target(t));
    else
      spec->targets.push_back(parse_target(j));
    for (size_t k = 0; k < spec->targets.size(); ++k) spec->by_op[spec->targets[k].op].push_back(k);
    spec->done.reset(new std::atomic<bool>[spec->targets.size()]());
    spec->left = spec->targets.size();
    return spec;
  } catch (const std::exception&) {
    return nullptr;  // the CLI wrote it; it finds no capture.json and says the spec was unread
  }
}

}  // namespace

CaptureSpec* capture_spec() {
  static CaptureSpec* spec = load_spec();
  return spec;
}

void capture_op(CaptureSpec& spec, size_t k, const at::RecordFunction& fn,
                const std::vector<std::string>& digests, std::optional<at::Generator> generator) {
  if (spec.done[k].exchange(true)) return;
  spec.left.fetch_sub(1, std::memory_order_relaxed);
  const CaptureTarget& target = spec.targets[k];
  nlohmann::json j = {{"op", target.op}, {"occurrence", target.occurrence}};
  try {
    const auto name = fn.operator_name();
    j["overload"] = name ? name->overload_name : "";
    // The program took another path if the op read other bytes than the recorded one.
    std::vector<nlohmann::json> differing;
    if (digests.size() != target.inputs.size()) {
      j["status"] = "other-path";
      j["why"] = "the op has " + std::to_string(digests.size()) + " tensor inputs, the record " +
                 std::to_string(target.inputs.size());
      write_result(target, j);
      return;
    }
    for (size_t i = 0; i < digests.size(); ++i)
      if (!target.inputs[i].empty() && !digests[i].empty() && digests[i] != target.inputs[i])
        differing.push_back({{"input", i}, {"recorded", target.inputs[i]}, {"now", digests[i]}});
    if (!differing.empty()) {
      j["status"] = "other-path";
      j["why"] = "its inputs differ from the record's";
      j["differing_inputs"] = differing;
      write_result(target, j);
      return;
    }
    std::vector<c10::IValue> args;
    std::vector<int> compacted, generators;
    for (const c10::IValue& v : fn.inputs()) {
      if (v.isGenerator()) {
        // Not picklable: the replay draws from its device's default generator, set to this
        // one's state (rng.pt).
        generators.push_back(int(args.size()));
        args.emplace_back();
        continue;
      }
      // An undefined tensor (nll_loss_backward's absent weight) cannot be pickled: saved as
      // None, which the replayer turns back into one where the schema wants a Tensor.
      if (v.isTensor() && !v.toTensor().defined()) {
        args.emplace_back();
        continue;
      }
      // The bytes as the op received them, where they lay, not a later version of the tensor.
      bool compact = false;
      args.push_back(v.isTensor() ? c10::IValue(copy_with_layout(v.toTensor(), &compact)) : v);
      if (compact) compacted.push_back(int(args.size()) - 1);
    }
    if (!compacted.empty()) j["compacted"] = compacted;
    if (!generators.empty()) j["generator_arguments"] = generators;
    if (generator) {
      at::Tensor state;
      {
        std::lock_guard<std::mutex> lock(generator->mutex());
        state = generator->get_state();
      }
      const std::vector<char> rng = torch::jit::pickle_save(
          c10::ivalue::Tuple::create({c10::IValue(generator->device().str()), c10::IValue(state)}));
      if (write_file(target.dir + "/rng.pt", rng.data(), rng.size()))
        j["rng_file"] = target.dir + "/rng.pt";
    }
    const std::vector<char> bytes = torch::jit::pickle_save(
        c10::ivalue::Tuple::create(std::move(args)));
    if (!write_file(target.dir + "/inputs.pt", bytes.data(), bytes.size())) {
      j["status"] = "error";
      j["why"] = "cannot write " + target.dir + "/inputs.pt";
    } else {
      j["status"] = "saved";
      j["inputs_file"] = target.dir + "/inputs.pt";
    }
  } catch (const std::exception& e) {
    j["status"] = "unsupported";
    j["why"] = std::string("its inputs cannot be saved: ") + e.what();
  }
  write_result(target, j);
}

}  // namespace detaudit::hooks
