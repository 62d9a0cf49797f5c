// A run that stopped and resumed from a checkpoint (issue 60), compared with one that ran through,
// or with another resumed run.
//
// In the resumed run a later process takes the name of the one before it with "~<k>"
// ("r0.main~1" after "r0.main", stream_identity.h) and counts its steps from 0 again. Its steps
// continue the other run's from the checkpoint's step R: found from the tensors it reads in its
// first step, which the other run read at step R only (its parameters as loaded), or given.
// Then the first process is compared with the other run's steps before R, and the resumed one,
// past its own setup (building the model, loading the checkpoint), with the other run's from R on.
// What differs at R is what the checkpoint did not restore (resume_cause).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "diff/comparator.h"
#include "diff/library_threads.h"
#include "diff/report_model.h"
#include "diff/stream_selection.h"
#include "util/status.h"

namespace detaudit {

// Finds the resumed processes of both runs: a process of one run only whose name ends "~<k>",
// when the process before it is in both. Cuts the selection's stream pairs at each one's resume
// step (StreamWindow), pairing the resumed process's streams with the other run's. `given`: the
// step to take where the tensors cannot tell (detaudit diff --resume-step). Says in `notes`
// what it could not resolve.
Status find_resumes(StreamSelection* selection, std::optional<uint64_t> given,
                    std::vector<ResumedProcess>* out, std::vector<std::string>* notes);

// A fresh process's first step runs ops the run that went through does not, for state no
// checkpoint carries: torch 1.x's zero_grad zeroes gradients the resumed process has not made
// yet, and their first accumulation takes another path. So a resumed stream's op sequence
// differences at its resume step are compared past and not counted (StreamWindow::resume_step);
// this says them in `notes`, with whether every value of that step agreed.
void note_resume_step_structure(const std::vector<ResumedProcess>& resumes,
                                const std::vector<StreamResult>& results,
                                std::vector<std::string>* notes);

// A fresh process's first step may lay a buffer out anew: DDP fills its gradient buckets in
// parameter order in a process's first iteration. The comparator does not count a collective of
// a resumed stream's resume step whose differing outputs hold the same values in another order
// (StreamResult::reordered_at_resume); this says them in the notes and counts them on the
// resume (ResumedProcess::reordered_ops).
void note_fresh_layouts(const std::vector<StreamResult>& results, DiffReport* r);

// A first divergence in a resumed stream at its resume step: what the checkpoint did not
// restore, as the cause, with evidence and the remedy. Marks each resumed process verified when
// nothing of it diverged.
void explain_resumes(const StreamSelection& selection, DiffReport* r);

}  // namespace detaudit
