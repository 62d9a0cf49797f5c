// `run --sentinel`: from the diff of two sentinel runs (each step's parameters, gradients,
// optimizer state and loss), records the first divergent step and the one before it in full,
// twice, and makes their diff the report, the step-level finding kept in it.
#pragma once

#include "config/config.h"
#include "diff/report_model.h"
#include "run/session.h"

namespace detaudit::cli {

// `report` is the sentinel runs' diff; on return it is the report to render.
void localize_divergent_step(const Config& config, const run::RunOptions& options,
                             DiffReport* report);

}  // namespace detaudit::cli
