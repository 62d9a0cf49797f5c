// The likely cause and its remedy (explain.cpp), from the class the classifier gave, the catalog
// entry and the environment differences. Explanations read the classification, never change it.
#pragma once

#include <vector>

#include "diff/report_model.h"

namespace detaudit {

// The runs' torch builds differ: their versions or their commits.
bool torch_builds_differ(const std::vector<EnvDifference>& env);

// Names the likely cause from the class, the catalog entry and the environment differences,
// and the remedy.
void explain_cause(const std::vector<EnvDifference>& env, FirstDivergence* fd);

}  // namespace detaudit
