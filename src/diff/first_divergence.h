// Which of the streams' own first divergences the report names, how it spread, and where it
// came from: the diff's phases after the streams were compared.
//
//   const FirstDivergence* first = choose_first(candidates, selection.heads);
//   add_spread(candidates, &report_first);
//   trace_origin(selection, firsts, &report_first);   // then explain_cause (classify.h)
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "diff/library_threads.h"
#include "diff/report_model.h"
#include "diff/stream_selection.h"

namespace detaudit {

// The first divergence among the streams' own: one no other happened before (collectives order
// ranks), else the earliest by step and rank; null when there is none.
const FirstDivergence* causal_first(const std::vector<const FirstDivergence*>& candidates);

// causal_first, except that bytes a parent read from shared memory (Hogwild's final parameters)
// were written by its children, which read each other's writes first: the earliest child's.
const FirstDivergence* choose_first(const std::vector<const FirstDivergence*>& candidates,
                                    const std::map<std::string, StreamHead>& heads);

// Adds to `first`'s spread each candidate that received its difference through a collective.
void add_spread(const std::vector<const FirstDivergence*>& candidates, FirstDivergence* first);

// Where the difference came from, when another process made it: a batch a DataLoader worker
// made (the worker's own first divergence replaces the consumer's), or bytes in shared memory
// another process wrote. `firsts`: each stream's own first divergence, by stream name.
void trace_origin(const StreamSelection& selection,
                  const std::map<std::string, const FirstDivergence*>& firsts,
                  FirstDivergence* first);

// Why no candidate could be named first: every one follows another through a collective (two
// ranks each received a difference the other did not send), or no stream held a candidate.
std::string why_no_first(const std::vector<const FirstDivergence*>& candidates, uint64_t ops,
                         const std::vector<PoolComparison>& pools);

}  // namespace detaudit
