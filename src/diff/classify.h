// Why two aligned ops differ: the divergence class from inputs, arguments, RNG state and tensor
// provenance; the tensors side by side; the statistics deltas; and the likely cause.
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "catalog/catalog.h"
#include "diff/op_source.h"
#include "diff/report_model.h"

namespace detaudit {

// True when the outputs of two aligned ops differ, ignoring uninitialized outputs.
bool outputs_differ(const trace::OpRecord& a, const trace::TraceReader& ra,
                    const trace::OpRecord& b, const trace::TraceReader& rb);

// Fills class, detail, tensors and magnitude of a value divergence between aligned ops.
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

// The classifier's rules whose evidence is found beyond one aligned pair of ops, applied where
// it is. Each sets the class and its line of evidence, and nothing else: the class is assigned
// in this file only, and explanations (explain_cause) read it.
// Different op sequences.
void classify_structural(std::string detail, FirstDivergence* fd);
// Input `input`, external to this process and in shared memory, is written by another recorded
// process (first_divergence.h's shared writer).
void classify_shared_writer(int input, FirstDivergence* fd);
// The same inputs, other outputs, under another torch build: not nondeterminism.
void classify_under_torch_builds(const std::vector<EnvDifference>& env, FirstDivergence* fd);
// A step's end state differs where the ops that made it were not recorded (--sentinel).
void classify_step_level(std::string detail, FirstDivergence* fd);
// A resumed process read a batch the other run read at an earlier step: its data loader started
// over, data entering the program (resume.h).
void classify_resumed_data_order(FirstDivergence* fd);

// Every tensor of the op is on the CPU in run A (a CPU kernel, a CPU generator).
bool on_cpu(const FirstDivergence& fd);

void classify_divergence(const BufferedOp& a, const OpSource& sa, const BufferedOp& b,
                         const OpSource& sb, const GateConfig& gate, FirstDivergence* out,
                         const SeenOutputs* seen = nullptr);

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

// The first catalog entry for this op whose conditions are not known to be unmet. Entries in
// `rejected` (unmet by an inner op of the same chain, e.g. accumulate=false seen on
// aten::_index_put_impl_) are skipped for outer ops such as IndexBackward0, whose arguments
// cannot be checked; entries found unmet here are added to it.
std::optional<CatalogRef> catalog_ref(const Catalog* catalog, const OpFacts& facts,
                                      std::vector<std::string>* rejected);

// The runs' torch builds differ: their versions or their commits.
bool torch_builds_differ(const std::vector<EnvDifference>& env);

// Names the likely cause from the class, the catalog entry and the environment differences,
// and the remedy.
void explain_cause(const std::vector<EnvDifference>& env, FirstDivergence* fd);

}  // namespace detaudit
