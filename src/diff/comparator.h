// Compares one stream (one thread of one process) of two runs in bounded memory: ops pair up
// in order, differing op sequences are realigned (aligner.h), outputs are compared by digest.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "catalog/catalog.h"
#include "diff/diff.h"
#include "diff/op_source.h"
#include "diff/report_model.h"
#include "diff/stream_selection.h"

namespace detaudit {

struct StreamResult {
  StreamSummary summary;
  std::optional<FirstDivergence> first;  // of this stream
  int64_t rank = 0;
  std::vector<StructuralDifference> structural;  // the first kMaxStructural
  uint64_t structural_count = 0;
  // A fresh process's, at a resumed stream's resume step and the next (StreamWindow): the
  // first kMaxStructural.
  std::vector<StructuralDifference> resume_step_structure;
  uint64_t resume_step_structure_count = 0;
  // Ops of a resumed stream's resume step whose differing outputs hold the same values in
  // another order (a fresh process lays DDP's gradient buckets out anew): not divergent. The
  // first one: "c10d::allreduce_ (output 0: 1153 float32 values, digests 1a2b... and 3c4d...)".
  uint64_t reordered_at_resume = 0;
  std::string first_reordered;
  uint64_t divergent_ops = 0;
  // Of them, those that write training state and those that write none (TrainingCheck).
  uint64_t divergent_training_writes = 0, divergent_outside = 0;
  std::vector<std::string> outside_training;  // the first TrainingCheck::kMaxOutside
  std::map<uint64_t, uint64_t> per_step;
  std::map<uint64_t, StepPoint> curve;
  std::map<uint64_t, LossPoint> loss;
  std::vector<uint64_t> divergent_orders;  // run A's program orders of divergent ops (bounded)
  std::vector<ParameterDivergence> parameters;
  uint64_t parameters_tracked = 0;
  uint64_t unread = 0;
  std::optional<UnreadDifference> first_unread;
  std::optional<NumericsChange> numerics_change;
  std::vector<Truncation> truncated;
  bool beyond_tolerance = false;
  bool structure_tolerated = false;          // op sequence differences the tolerance gate let pass
  uint64_t structure_matched = 0;            // replaced regions whose values handed on agree
  uint64_t structure_same_bits = 0;          // of those, regions handing on the same bits
  std::vector<EnvDifference> step_settings;  // STEP records whose threads or flags differ
  uint64_t records_a = 0, records_b = 0, bytes = 0;
  uint64_t max_step_a = 0, max_step_b = 0;              // the largest step of each run's ops
  uint64_t backward_passes_a = 0, optimizer_ops_a = 0;  // run A's (OpSource)
  bool cut_a = false, cut_b = false;  // no END record: that run's process did not end cleanly
  // How each run's stream ended (its END record: a signal's, for a crash) and its last op.
  struct Tail {
    bool ended = false;
    trace::EndInfo end;
    bool any_op = false;
    std::string last_op;
    uint64_t last_step = 0, last_index = 0, last_order = 0;
  };
  Tail tail_a, tail_b;
  // A stream in one run only: the step of its first op.
  std::optional<uint64_t> unpartnered_first_step;
};

// A DataLoader worker's stream is compared up to the last step its consumer ran, in each run.
struct StreamLimits {
  std::optional<uint64_t> last_step_a, last_step_b;
  // The part of the pair a resume cuts (resume.h); a fresh process's op sequence differences
  // are kept apart (StreamResult::resume_step_structure), not counted.
  StreamWindow window;
  // That run lost part of its world (a node never finished, a rank left no trace): where its
  // stream ends first, the rest of the other run's was not compared, as for a cut.
  bool world_lost_a = false, world_lost_b = false;
  // Given every op read from that run's stream (the replica check's folds: diff_runs).
  OpTap on_op_a, on_op_b;
};

inline constexpr size_t kMaxStructural = 20;

// Progress callback: stream name, bytes read so far, total bytes.
using ProgressFn = std::function<void(const std::string&, uint64_t, uint64_t)>;

// Compares two trace files of one stream. A corrupt file is an error naming file and offset
// (exit 3); a cut-short one is a Truncation in the result. fingerprint_a: the flattened
// environment fingerprint of the stream's process in run A, for catalog conditions; may be null.
Status compare_stream(const std::string& name, const std::string& path_a, const std::string& path_b,
                      const DiffOptions& options, const std::vector<EnvDifference>& env,
                      const ProgressFn& progress, StreamResult* out,
                      const StreamLimits& limits = {},
                      const std::map<std::string, std::string>* fingerprint_a = nullptr);

// Reads a stream present in one run only: counts its ops, checks it is readable.
Status count_stream(const std::string& name, const std::string& path, bool in_a, StreamResult* out,
                    const OpTap& on_op = nullptr);

}  // namespace detaudit
