// The evidence a classification reads (classify.h): where a tensor's contents came from, the
// op's tensors side by side, and how far their statistics moved (docs/report.md, "Numerics").
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "diff/op_source.h"
#include "diff/report_model.h"

namespace detaudit {

// True when the outputs of two aligned ops differ, ignoring uninitialized outputs.
bool outputs_differ(const trace::OpRecord& a, const trace::TraceReader& ra,
                    const trace::OpRecord& b, const trace::TraceReader& rb);

// Every output whose digest differs holds the same values in another order (equal dtype, count,
// extremes and non-finite counts; mean and l2 equal up to the order their sums were taken in),
// and one does: a buffer laid out anew. The first such output's index in `first`.
bool outputs_reordered(const trace::OpRecord& a, const trace::TraceReader& ra,
                       const trace::OpRecord& b, const trace::TraceReader& rb, size_t* first);

// The largest relative difference of the op's differing outputs, from their statistics (see
// StepPoint::max_relative).
double largest_relative_difference(const trace::OpRecord& a, const trace::TraceReader& ra,
                                   const trace::OpRecord& b, const trace::TraceReader& rb);

// The output digests each run made before the first divergence (their first 8 bytes), so an
// input that is an earlier output in both runs, but a different one, is told apart: the same
// tensors in a different order. Appended on every matching op and searched once, at the first
// divergence: a plain vector (8 bytes an output, at most 8 MB a run), not a hash set.
struct SeenOutputs {
  static constexpr size_t kMax = 1u << 20;
  // An output both runs agreed on: its digest's first 8 bytes, and the op that made it.
  struct Made {
    uint64_t key;
    uint32_t index;  // the op's position in its stream (saturated)
    uint32_t name;   // the op's name, an id of that run's string table
  };
  std::vector<Made> a, b;
  static uint64_t key(const trace::DigestBytes& d) {
    uint64_t k;
    std::memcpy(&k, d.data(), 8);
    return k;
  }
  static const Made* find(const std::vector<Made>& made, const trace::DigestBytes& d) {
    const uint64_t k = key(d);
    auto it = std::find_if(made.begin(), made.end(), [k](const Made& m) { return m.key == k; });
    return it == made.end() ? nullptr : &*it;
  }
  static bool has(const std::vector<Made>& made, const trace::DigestBytes& d) {
    return find(made, d) != nullptr;
  }
};

// Where a tensor's contents came from, following view bases inside the stream's window:
// "external", "output of an earlier op", "uninitialized (empty family)", a view of one of these.
std::string origin_of(const trace::TensorDesc* t, const trace::TraceReader& r, bool* external,
                      bool* uninitialized, bool* compiled = nullptr);

// One tensor as one run recorded it.
TensorSide side_of(const trace::TensorDesc* t, const trace::TraceReader& r);

// The op's tensors side by side into fd->inputs and fd->outputs; the first differing input
// (which decides between the input classes), or -1.
int pair_tensors(const BufferedOp& a, const OpSource& sa, const BufferedOp& b, const OpSource& sb,
                 FirstDivergence* fd);

// Every tensor of the op is on the CPU in run A (a CPU kernel, a CPU generator).
bool on_cpu(const FirstDivergence& fd);

// The statistics deltas of the differing outputs; true when all are within the gate's tolerance.
bool output_deltas(const trace::OpRecord& a, const trace::TraceReader& ra, const trace::OpRecord& b,
                   const trace::TraceReader& rb, const GateConfig& gate,
                   std::vector<StatsDelta>* out);

// How far the tensors of one side of an op (its inputs, or its outputs) that differ are from run
// A's, from their statistics, each difference scaled as delta_of scales it (docs/report.md,
// "Numerics"): the largest, and whether every one is within the gate's tolerance.
struct Deviation {
  double relative = 0;  // 0: none differs, or none has statistics
  double ulps = -1;     // relative in units of the dtype's epsilon; -1 for integer dtypes
  bool within = true;
  std::string tensor;  // "output 0", the furthest out; "" when none differs
  std::string dtype;
};
Deviation tensors_deviation(const std::vector<int64_t>& ids_a, const trace::TraceReader& ra,
                            const std::vector<int64_t>& ids_b, const trace::TraceReader& rb,
                            const GateConfig& gate, const char* role = "output");

// How far run B's tensor is from run A's, each statistic at its scale (docs/report.md,
// "Numerics"), and whether that is within the gate's tolerance.
StatsDelta stats_delta(const trace::TensorDesc& a, const trace::TensorDesc& b,
                       const GateConfig& gate);

// The spacing of a dtype's values near 1 (float32: 2^-23); 0 for integer and boolean dtypes.
double dtype_epsilon(trace::Dtype dtype);

// A torch.compile kernel's origin argument ("aten::index_put, aten::mul; atomic adds"); "" for
// any other op.
std::string kernel_origin(const trace::OpRecord& op, const trace::TraceReader& r);

}  // namespace detaudit
