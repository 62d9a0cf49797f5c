// DETAUDIT_DCHECK(condition, "what the code relies on"): a contract written as code. Checked in
// the builds the tests run (DETAUDIT_CHECKS: tests/build.sh and the sanitizer builds), compiled
// out of a user's install, where a bug of detaudit's must not stop the program it records. A
// failure is detaudit's bug: it names the contract and where, and aborts.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace detaudit {

[[noreturn]] inline void check_failed(const char* condition, const char* what, const char* file,
                                      int line) {
  std::fprintf(stderr, "detaudit: internal check failed at %s:%d: %s (%s); please report it\n",
               file, line, what, condition);
  std::abort();
}

}  // namespace detaudit

#ifdef DETAUDIT_CHECKS
#define DETAUDIT_DCHECK(condition, what) \
  ((condition) ? void(0) : ::detaudit::check_failed(#condition, what, __FILE__, __LINE__))
#else
#define DETAUDIT_DCHECK(condition, what) void(0)
#endif
