// Replica consistency within one run: data-parallel ranks must hold the same parameters after
// every optimizer step. One run is enough to check it.
//
// The parameters are what the optimizer writes in place (its phase's in-place ops, in order,
// one position per write), on each rank's main thread. Ranks that all ran an all-reduce fall
// into replica groups: ranks whose writes of their first recorded step all agree, in shape and
// in the parameter read (DDP: one group; HSDP: one per shard). Ranks in no group are shards or
// not data-parallel (tensor or pipeline parallel, sharded optimizers) and are not checked. From
// there on, the first position where a rank's written parameter differs from its group's lowest
// rank's is a replica divergence, with where the two ranks' streams part.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "trace/reader.h"
#include "trace/run_directory.h"
#include "util/status.h"

namespace detaudit {

struct ReplicaDivergence {
  uint64_t step = 0;
  uint64_t position = 0;       // k-th parameter write of the step
  std::string op;              // the optimizer's op ("aten::add_")
  int64_t rank = 0;            // the rank that disagrees with its group's lowest rank
  int64_t reference_rank = 0;  // that lowest rank
  std::string stream, reference_stream;
  std::string digest, reference_digest;  // hex
  std::vector<int64_t> sizes;
  // What differs going into the write: "parameter" (changed since the last step's update),
  // "gradient" (the all-reduced gradient differs) or "" (same inputs: the update itself).
  std::string input_differs;
  // Where the two ranks' streams part first: an op one of them ran and the other did not
  // ("r1.main.t-main op #412 aten::add_, step 2, forward"), or "".
  std::string parted_at;
  std::string detail;  // one line of evidence
};

struct ReplicaCheck {
  std::string run_dir;
  std::vector<int64_t> ranks;  // the ranks whose main threads ran optimizer writes
  bool replicas = false;       // some of them agreed at their first recorded step
  // Ranks that agreed, a group per shard (one for DDP), each group's lowest rank first.
  std::vector<std::vector<int64_t>> groups;
  std::string not_checked;  // why not, when !replicas and there are 2+ ranks
  uint64_t steps_checked = 0;
  uint64_t parameters = 0;  // writes per step, in the first group
  std::optional<ReplicaDivergence> divergence;
};

// What a rank's main thread wrote in one step, folded to a few words, so that a thousand
// ranks' whole runs fit: the count, and two 64-bit folds of the writes in order.
struct StepFold {
  uint32_t count = 0;
  uint64_t outputs = 0;     // each write's parameter left and its shape
  uint64_t parameters = 0;  // each write's shape and the parameter read (replica groups)
  bool same_outputs(const StepFold& o) const { return count == o.count && outputs == o.outputs; }
  bool same_parameters(const StepFold& o) const {
    return count == o.count && parameters == o.parameters;
  }
};

// What the check keeps of one rank's main thread.
struct RankFolds {
  int64_t rank = 0;
  std::string name, path;              // the stream, and its file
  std::map<uint64_t, StepFold> folds;  // by step
  bool all_reduces = false;  // ran an all-reduce: data parallel, not independent processes
};

// Builds a rank's folds from its main thread's ops as a reader meets them: the diff's comparison
// passes every op of each rank's main thread through one, so the check reads nothing again.
class ReplicaFolder {
 public:
  explicit ReplicaFolder(RankFolds* out) : out_(out) {}
  void op(const trace::TraceReader& r, const trace::OpRecord& op);

 private:
  RankFolds* out_;
  uint64_t index_ = 0;
};

// Reads the main-thread streams of every rank of a run once, on `threads` threads (0: one a
// core), keeping a fold of each step's writes; the ranks that part at a step are read again for
// it. A corrupt stream is an error.
Status check_replicas(const trace::RunDirectory& run, ReplicaCheck* out, unsigned threads = 0);

// The two halves, for a diff split over machines (diff/partial.h): each part reads its ranks'
// folds, and the merge checks them all.
Status read_replica_folds(const trace::RunDirectory& run, const RangeSet& ranks, unsigned threads,
                          std::vector<RankFolds>* out);
Status check_replicas_from(const trace::RunDirectory& run, std::vector<RankFolds> folds,
                           ReplicaCheck* out);

nlohmann::json replica_check_to_json(const ReplicaCheck& c);
// A few lines for the text reports: what was checked and, if so, where replicas parted.
std::string render_replica_check(const ReplicaCheck& c);

}  // namespace detaudit
