// Independent pieces of work on every core: the diff's streams, the replica check's ranks.
#pragma once

#include <cstddef>
#include <functional>

#include "util/status.h"

namespace detaudit {

// Runs work(0), ..., work(n - 1) on up to `threads` threads (0: one a core), each index once.
// The first error stops what has not started and is returned.
Status for_each_parallel(size_t n, unsigned threads, const std::function<Status(size_t)>& work);

}  // namespace detaudit
