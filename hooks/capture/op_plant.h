// hooks/capture: `run --selftest`'s plants. In a run of its own, one element of one value an op
// made is changed before the recorder describes it, as a kernel that computed other bits would
// have; the diff against run-0 must then name that op. The target is named as a capture's is
// (op_capture.h: a "plant" target), and <dir>/plant.json says what was changed:
//
//   {"status": "planted", "op": "aten::addmm", "occurrence": 41, "step": 3,
//    "value": "output 0", "declared": true, "before": 0.25, "after": 0.25025}
//   {"status": "nothing-to-change", "op": ..., "why": "it made no floating-point value"}
//
// The change bypasses autograd (no version bump: a tensor saved for the backward stays usable)
// and the recorder's own bookkeeping: what the recorder would miss of a real change, it misses
// of this one.
#pragma once

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <string>
#include <utility>
#include <vector>

#include "capture/op_capture.h"

namespace detaudit::hooks {

// A value the op made, as the report names it ("output 0", "written argument exp_avgs[2]"),
// and whether its schema says the op writes it.
struct PlantValue {
  at::Tensor tensor;
  std::string name;
  bool declared = true;
};

// The op's tensor arguments as it starts, with a copy of each, to tell at its end which of them
// it changed though its schema does not say it writes them (a kernel writing through data_ptr).
struct ArgumentWatch {
  std::vector<std::pair<at::Tensor, at::Tensor>> args;  // argument, its bytes before
  std::vector<size_t> positions;                        // its place among the op's arguments
};
ArgumentWatch watch_arguments(const at::RecordFunction& fn);
// The watched arguments whose bytes changed, as undeclared values.
std::vector<PlantValue> changed_arguments(const ArgumentWatch& watch);

// Target `k` of the spec, reached: changes one element of the first floating-point value among
// `values` and writes its plant.json. Once per target; never throws.
void plant_change(CaptureSpec& spec, size_t k, uint64_t step,
                  const std::vector<PlantValue>& values);

}  // namespace detaudit::hooks
