// A failed EXPECT_EQ on a report's typed values says their names, not their numbers.
#pragma once

#include <ostream>

#include "diff/report_model.h"

namespace detaudit {

inline void PrintTo(Verdict v, std::ostream* os) { *os << verdict_name(v); }
inline void PrintTo(DivergenceClass c, std::ostream* os) { *os << divergence_class_name(c); }

}  // namespace detaudit
