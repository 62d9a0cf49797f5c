#include "capture/op_plant.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

namespace detaudit::hooks {
namespace {

bool plantable(const at::Tensor& t) {
  return t.defined() && t.layout() == at::kStrided && t.has_storage() && !t.is_meta() &&
         t.is_floating_point() && t.numel() > 0;
}

// The first element (at the storage offset), scaled by 1 + relative, doubled until the dtype
// holds a different value (bfloat16's step is 2^-8); 0 becomes `relative`.
bool change_first_element(const at::Tensor& t, double relative, double* before, double* after) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  at::Tensor element = t.as_strided({}, {}, t.storage_offset());
  const double x = element.item<double>();
  if (!std::isfinite(x)) return false;
  for (double r = relative; r <= 1.0; r *= 2) {
    const double y = x == 0 ? r : x * (1 + r);
    at::Tensor changed = at::scalar_tensor(y, at::TensorOptions().dtype(t.scalar_type()));
    if (changed.item<double>() == x) continue;
    element.copy_(changed);
    *before = x;
    *after = changed.item<double>();
    return true;
  }
  return false;
}

void write_plant_json(const CaptureTarget& t, const nlohmann::json& j) {
  const std::string path = t.dir + "/plant.json";
  std::ofstream out(path + ".tmp", std::ios::trunc);
  out << j.dump(2) << "\n";
  out.close();
  if (out) std::rename((path + ".tmp").c_str(), path.c_str());
}

}  // namespace

ArgumentWatch watch_arguments(const at::RecordFunction& fn) {
  ArgumentWatch watch;
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  auto keep = [&](const at::Tensor& t, size_t position) {
    if (!plantable(t)) return;
    watch.args.emplace_back(t, t.clone());
    watch.positions.push_back(position);
  };
  auto inputs = fn.inputs();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].isTensor()) keep(inputs[i].toTensor(), i);
    if (inputs[i].isTensorList())
      for (const at::Tensor& t : inputs[i].toTensorList().vec()) keep(t, i);
  }
  return watch;
}

std::vector<PlantValue> changed_arguments(const ArgumentWatch& watch) {
  std::vector<PlantValue> changed;
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  for (size_t i = 0; i < watch.args.size(); ++i) {
    const auto& [arg, before] = watch.args[i];
    // Bit for bit: a NaN that stayed a NaN is unchanged.
    const bool same = arg.sizes() == before.sizes() &&
                      at::equal(arg.contiguous().reshape(-1).view(at::kByte),
                                before.contiguous().reshape(-1).view(at::kByte));
    if (!same)
      changed.push_back({arg, fmt::format("argument {}", watch.positions[i]), /*declared=*/false});
  }
  return changed;
}

void plant_change(CaptureSpec& spec, size_t k, uint64_t step,
                  const std::vector<PlantValue>& values) {
  const CaptureTarget& t = spec.targets[k];
  nlohmann::json j = {{"op", t.op}, {"occurrence", t.occurrence}, {"step", step}};
  try {
    for (const PlantValue& v : values) {
      double before = 0, after = 0;
      if (!plantable(v.tensor) || !change_first_element(v.tensor, t.relative, &before, &after))
        continue;
      j["status"] = "planted";
      j["value"] = v.name;
      j["declared"] = v.declared;
      j["before"] = before;
      j["after"] = after;
      j["dtype"] = std::string(c10::toString(v.tensor.scalar_type()));
      write_plant_json(t, j);
      return;
    }
    j["status"] = "nothing-to-change";
    j["why"] = values.empty() ? "it made no tensor"
                              : "it made no finite floating-point value with storage";
  } catch (const std::exception& e) {
    j["status"] = "error";
    j["why"] = e.what();
  }
  write_plant_json(t, j);
}

}  // namespace detaudit::hooks
