// Why two aligned ops differ: the divergence class, decided here only, from the evidence
// (evidence.h: inputs, arguments, RNG state and tensor provenance), then explained (explain.h).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "catalog/catalog.h"
#include "diff/evidence.h"
#include "diff/explain.h"

namespace detaudit {

// Fills class, detail, tensors and magnitude of a value divergence between aligned ops.
void classify_divergence(const BufferedOp& a, const OpSource& sa, const BufferedOp& b,
                         const OpSource& sb, const GateConfig& gate, FirstDivergence* out,
                         const SeenOutputs* seen = nullptr);

// The first catalog entry for this op whose conditions are not known to be unmet. Entries in
// `rejected` (unmet by an inner op of the same chain, e.g. accumulate=false seen on
// aten::_index_put_impl_) are skipped for outer ops such as IndexBackward0, whose arguments
// cannot be checked; entries found unmet here are added to it.
std::optional<CatalogRef> catalog_ref(const Catalog* catalog, const OpFacts& facts,
                                      std::vector<std::string>* rejected);

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
// A resumed process drew from NumPy's or Python's generator in another state than the other run:
// the checkpoint did not restore it (resume.h), random state.
void classify_resumed_generator(std::string detail, FirstDivergence* fd);

}  // namespace detaudit
