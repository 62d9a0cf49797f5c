// The comparator's entry points. DiffReport and the rest of the model live in diff/report_model.h.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "util/status.h"

namespace detaudit {

struct DiffReport;
enum class Verdict;
struct FirstDivergence;
class Catalog;

struct DiffOptions {
  GateConfig gate;
  const Catalog* catalog = nullptr;  // may be null: no explanations
  bool progress = false;             // progress lines on stderr (a TTY)
  unsigned threads = 0;              // streams compared at once (0: one a core)
  RangeSet ranks;                    // compare these ranks' streams only (default: all)
  // One part of a diff split by ranks (diff/partial.h): no replica check and no world lines
  // (the merge makes both), and every stream's own first divergence kept in the report.
  bool part = false;
  // The step a resumed process resumed at, where its tensors cannot tell (resume.h).
  std::optional<uint64_t> resume_step;
};

// Compares two run directories stream by stream, in bounded memory.
Status diff_runs(const std::string& run_a, const std::string& run_b, const DiffOptions& options,
                 DiffReport* report);

// "divergent" (ops, structure or replicas), "incomplete" (part not compared, unless the gate
// allows it), "identical"; "unexplained" when divergent with no first divergence to name and the
// replicas agree (the caller says why).
Verdict verdict_of(const DiffReport& report);
// The runs diverged, and none of it reaches the training state (TrainingCheck::identical): the
// training writes were compared and agree, and the first divergence's data flow reaches none.
bool training_identical(const DiffReport& report);
// Why a diff in which nothing diverged cannot pass ("" when it can): nothing compared, a
// sentinel that compared no step state, or a program that trained with no step seen. Kept in
// DiffReport::no_verdict, which verdict_of reads.
std::string why_no_verdict(const DiffReport& report);

// What the gate decided, as the report's first word: "identical", "identical values (other
// ops)", "training identical", "within tolerance", "beyond tolerance", "divergent", ... It is
// a passing word exactly when gate_exit_code is 0 (the text report prints it in capitals).
std::string gate_word(const DiffReport& report);

// 0 identical (or divergent within tolerance, or outside training under --fail-on training), 1 divergent, 5 incomplete (part of a run was
// not compared and the gate does not allow truncation).
ExitCode gate_exit_code(const DiffReport& report);

}  // namespace detaudit
