// `detaudit coverage`: which of the op types a run ran can give different bits, shown by replaying
// each on its own inputs. Two runs that agree show only that a race did not fire that time.
//
//   CoveragePlan plan;  plan_coverage("audit/run-0", catalog, &plan);      // one pass over a run
//   ... one new run of the command with DETAUDIT_CAPTURE = capture_targets_json(plan, dir) ...
//   read_captures(dir, &plan);  ... replayer --batch over plan.rows, lines into add_replay_line ...
//   CoverageReport report = judge_coverage(plan, budget_s, ...);
//
// An op type is the op's name, the dtype and device of its largest tensor, and a shape class: the
// number of dimensions and the power of two just above its element count ("2-D, <=2^17"). The
// occurrence replayed is the type's largest (by bytes read), so a race's chance is at its best.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "catalog/catalog.h"
#include "replay/replay.h"
#include "util/status.h"

namespace detaudit::replay {

enum class Coverage { kNondeterministic, kDeterministic, kUnverified };
const char* coverage_name(Coverage c);  // "verified-nondeterministic", "deterministic", ...

struct OpTypeRow {
  std::string op, dtype, device, shape_class;
  uint64_t occurrences = 0;
  uint64_t bytes = 0;                 // read by the occurrence replayed
  bool random = false;                // takes a generator: replayed from the state it had
  ReplayTarget target;                // that occurrence
  std::vector<int> compared_outputs;  // outputs the record hashed (others: shape only)
  std::string unverifiable;           // why it cannot be replayed, found from the record alone
  // The catalog's entries for the op ("" when it has none), and their remedy.
  std::vector<std::string> catalog_ids;
  std::string remedy;
  // Filled by the capture and the replays.
  std::string capture_status, capture_why;
  std::string overload, inputs_file, rng_file;
  std::vector<ReplaySeries> series;
  std::string replay_died;  // how the replayer died on this type ("" if it did not)
  // Filled by judge_coverage.
  Coverage verdict = Coverage::kUnverified;
  std::string why;  // the evidence, or the reason it is unverified
  std::string key() const;
};

struct CoveragePlan {
  std::string run_dir;
  std::string digest;  // the run's ("md5")
  uint64_t ops_scanned = 0;
  std::vector<OpTypeRow> rows;  // largest first: the budget is spent in this order
};

// One pass over every stream of a run. Collectives, compiled regions and ops with no compared
// output are rows already unverified, with their reason.
Status plan_coverage(const std::string& run_dir, const Catalog& catalog, CoveragePlan* out);

// The capture spec of every row still to replay (hooks/capture/op_capture.h), each into
// <dir>/<row>/.
nlohmann::json capture_targets_json(const CoveragePlan& plan, const std::string& dir);
// Each row's <dir>/<row>/capture.json ("not-reached" where absent).
void read_captures(const std::string& dir, CoveragePlan* plan);

// The replayer's manifest for the rows given, in their order (hooks/capture/replay_main.cpp).
nlohmann::json replay_manifest(const CoveragePlan& plan, const std::vector<size_t>& rows,
                               int replays, int64_t deadline_ms);
// One line of the replayer's --batch output, added to its row's series. False if unreadable.
bool add_replay_line(const std::string& line, CoveragePlan* plan);

struct CoverageReport {
  std::string run_dir;
  std::string digest;
  int replays = 0;
  double budget_s = 0, spent_s = 0;
  int workers = 0;
  uint64_t ops_scanned = 0;
  std::vector<OpTypeRow> rows;  // nondeterministic first, then unverified, then deterministic
  int nondeterministic = 0, deterministic = 0, unverified = 0;
  int unknown_to_catalog = 0;  // nondeterministic rows with no catalog entry
};

// Each row's verdict. Rows never replayed (the budget ran out first) are unverified, saying so.
CoverageReport judge_coverage(CoveragePlan plan, int replays, double budget_s, double spent_s,
                              int workers);

nlohmann::json coverage_to_json(const CoverageReport& r);
std::string render_coverage_text(const CoverageReport& r, bool color);
std::string render_coverage_markdown(const CoverageReport& r);
// JUnit: a case per op type, failing when the type is verified nondeterministic; unverified ones
// are skipped with their reason.
std::string render_coverage_junit(const CoverageReport& r);
std::string render_coverage_html(const CoverageReport& r);  // self-contained, with a plot

}  // namespace detaudit::replay
