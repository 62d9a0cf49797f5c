// The risk report of a single run: which catalog ops actually ran, how often, and which of
// their conditions they met; plus environment settings known to cause nondeterminism.
//
//   RiskReport risk;
//   if (Status s = risk_report("audit/run-0", catalog, &risk); !s.ok()) ...
//   std::cout << render_risk_report(risk, color);
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "catalog/catalog.h"
#include "diff/replicas.h"
#include "util/status.h"

namespace detaudit {

struct RiskHit {
  std::string entry_id;
  std::string op;
  std::string stream;  // where it ran first
  uint64_t count = 0;  // times it ran with no condition known to be unmet
  uint64_t first_step = 0;
  std::vector<std::string> conditions_met, conditions_unknown;  // at its first run
  std::string remedy;
  bool uncertain = false;
};

struct EnvironmentRisk {
  std::string entry_id;  // the catalog entry it relates to
  std::string process;
  std::string key, value;
  std::string why, remedy;
};

struct RiskReport {
  std::string run_dir;
  uint64_t ops_scanned = 0;
  std::vector<RiskHit> hits;  // by count, highest first
  std::vector<EnvironmentRisk> environment;
  std::vector<std::string> truncated;  // "file: offset N: why" of cut-short streams
  ReplicaCheck replicas;               // data-parallel ranks agree after each step?
};

// Scans every stream of a run directory once, in bounded memory. Corrupt input is an error
// (exit 3); a cut-short stream is scanned up to the cut and listed in `truncated`.
Status risk_report(const std::string& run_dir, const Catalog& catalog, RiskReport* out);

std::string render_risk_report(const RiskReport& report, bool color);
std::string render_risk_html(const RiskReport& report);  // src/report/html.cpp
nlohmann::json risk_report_to_json(const RiskReport& report);

}  // namespace detaudit
