// Threads a library runs ops on as timing allows. gloo's runloop threads take each collective's
// work as one comes free, so which thread runs which work, and in which step or phase, follows
// timing; what the work computes does not. Such a pool is compared as one multiset of ops per
// process, never thread by thread or in order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace detaudit {

// The library pool a thread name (its "~<k>" marks removed) belongs to, or nullptr.
struct LibraryPool {
  const char* thread;  // "pt_gloo_runloop"
  const char* why;     // one line for the report
};
const LibraryPool* library_pool(std::string_view thread_base);

// A pool of one process, compared as a multiset: an op of run A matches an op of run B with
// the same name, depth, user scopes, arguments, and tensor geometry and digests.
struct PoolComparison {
  std::string process;  // "r0.main"
  const LibraryPool* pool = nullptr;
  std::vector<std::string> streams_a, streams_b;
  uint64_t ops_a = 0, ops_b = 0, matched = 0;
  // Ops of run A (resp. B) without a match, by step: their data or their number differs.
  uint64_t unmatched_a = 0, unmatched_b = 0;
  uint64_t first_unmatched_step = 0;
  std::string first_unmatched_op;  // run A's (else B's) first unmatched op, by step then order
  bool truncated = false;          // a stream of either run has no END record
  bool truncated_a = false, truncated_b = false;
  // Ops of one run with no match in the other whose pool streams were cut: not compared, not
  // counted as unmatched (the cut may have taken their partners).
  uint64_t uncompared_a = 0, uncompared_b = 0;
  // A resumed process's pool (resume.h), compared within its predecessor's: the paths it wrote,
  // in run `resumed_run`. Those of its ops that repeat one of its predecessor's exactly, beyond
  // what the other run ran, are its setup run again (a fresh process builds its model: DDP
  // broadcasts the parameters from rank 0), not counted as unmatched.
  int resumed_run = -1;
  std::vector<std::string> resumed_paths;
  uint64_t setup_repeats = 0;
};

// `out->truncated_a`/`_b` may be set before the call: the process did not exit in that run, so
// its pool's streams end where it stopped, whole or not.
Status compare_pool(const std::vector<std::string>& paths_a,
                    const std::vector<std::string>& paths_b, PoolComparison* out);

}  // namespace detaudit
