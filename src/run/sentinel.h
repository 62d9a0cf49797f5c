// `run --sentinel`: from the diff of two sentinel runs (each step's parameters, gradients,
// optimizer state and loss), records the first divergent step and the one before it in full,
// twice, and makes their diff the report, the step-level finding kept in it.
#pragma once

#include <string>

#include "config/config.h"
#include "diff/report_model.h"
#include "run/session.h"

namespace detaudit::run {

// `report` is the sentinel runs' diff; on return it is the report to render. `catalog_path`:
// the catalog whose ops the step-level finding lists when the full recording agrees.
void localize_divergent_step(const Config& config, const RunOptions& options,
                             const std::string& catalog_path, DiffReport* report);

}  // namespace detaudit::run
