// What a diff found, independent of how it is rendered (text, JSON, JUnit, Markdown).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "config/config.h"
#include "diff/library_threads.h"
#include "diff/replicas.h"
#include "diff/roles.h"
#include "trace/format.h"

namespace detaudit {

// What a diff concludes (diff.h's verdict_of). kUnexplained: divergent with no first divergence
// to name and the replicas agree, which is the tool's failure, not the program's. kNoVerdict:
// nothing diverged, but the audit saw too little to say "identical" (DiffReport::no_verdict).
// kFailed: the program failed by itself (an exit status, a crash inside an op) in both runs, and
// what both recorded agrees, whole.
// kSameValues: the runs ran other ops in places, and every value those hand on, and every op
// after them, is the same bits (a refactor such as nn.Linear against `x @ W.t() + b`).
enum class Verdict {
  kIdentical,
  kSameValues,
  kDivergent,
  kIncomplete,
  kUnexplained,
  kNoVerdict,
  kFailed
};

// "identical", "divergent", "incomplete", "unexplained": the report's and the CLI's word.
inline const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kIdentical: return "identical";
    case Verdict::kSameValues: return "identical-values";
    case Verdict::kDivergent: return "divergent";
    case Verdict::kIncomplete: return "incomplete";
    case Verdict::kUnexplained: return "unexplained";
    case Verdict::kNoVerdict: return "no-verdict";
    case Verdict::kFailed: return "failed";
  }
  return "unexplained";
}

// Why the first divergent op differs (the report's "class"). kNone: no first divergence yet.
enum class DivergenceClass {
  kNone,
  kNondeterministicOp,
  kRngState,
  kExternalInput,
  kUninitializedMemory,
  kStructural,
  kInputDiffers,
  kRemoteInput,   // a collective whose own inputs agree received different data
  kSharedMemory,  // an input in shared memory changed with no write of this process
  kStepLevel,     // the sentinel's: a step's end state differs, its full recording agrees
  kTorchBuild,    // the same inputs, other outputs, under another torch build (or its libraries)
};

// The class's word in reports and partial diffs: "nondeterministic-op", "rng-state", ...
inline const char* divergence_class_name(DivergenceClass c) {
  switch (c) {
    case DivergenceClass::kNone: return "";
    case DivergenceClass::kNondeterministicOp: return "nondeterministic-op";
    case DivergenceClass::kRngState: return "rng-state";
    case DivergenceClass::kExternalInput: return "external-input";
    case DivergenceClass::kUninitializedMemory: return "uninitialized-memory";
    case DivergenceClass::kStructural: return "structural";
    case DivergenceClass::kInputDiffers: return "input-differs";
    case DivergenceClass::kRemoteInput: return "remote-input";
    case DivergenceClass::kSharedMemory: return "shared-memory";
    case DivergenceClass::kStepLevel: return "step-level";
    case DivergenceClass::kTorchBuild: return "torch-build";
  }
  return "";
}

// The class a name stands for; false for a name no class has.
inline bool parse_divergence_class(std::string_view name, DivergenceClass* out) {
  for (int i = 0; i <= static_cast<int>(DivergenceClass::kTorchBuild); ++i) {
    const auto c = static_cast<DivergenceClass>(i);
    if (name == divergence_class_name(c)) {
      *out = c;
      return true;
    }
  }
  return false;
}

// One tensor as one run recorded it.
struct TensorSide {
  bool present = false;
  std::string digest;  // hex
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;  // empty when contiguous
  std::string dtype, device, provenance;
  bool uninitialized = false;
  bool has_stats = false;
  trace::TensorStats stats;
  std::string
      origin;  // where its contents came from: "external", "uninitialized (aten::empty)", ...
  bool in_shared_memory = false;  // share_memory_(), a DataLoader batch

  uint64_t numel() const {
    uint64_t n = 1;
    for (int64_t s : sizes) n *= uint64_t(s);
    return n;
  }
};

// An input or output of the first divergent op, side by side.
struct TensorPair {
  std::string role;  // "input" or "output"
  int index = 0;     // among the op's tensors of that role
  bool differs = false;
  TensorSide a, b;
  // An output that is an argument the op wrote and did not return: "exp_avgs[2]".
  std::string written_argument;
  // What a differing tensor is to training, from run A's data flow (roles.h).
  TensorRole tensor_role = TensorRole::kUnknown;

  // "input 1", "output 0", "written exp_avgs[2]".
  std::string label() const {
    return written_argument.empty() ? role + " " + std::to_string(index)
                                    : "written " + written_argument;
  }
};

// Statistics deltas (b - a) of one differing tensor.
struct StatsDelta {
  std::string tensor;  // "output 0"
  bool has_stats = false;
  double min = 0, max = 0, mean = 0, l2 = 0;
  int64_t nan = 0, inf = 0;
  double max_abs = 0;  // largest |delta| over min/max/mean/l2
  // The largest |delta| as a fraction of its scale (the largest magnitude for min and max, the
  // root mean square for the mean, the norm for L2), and that in units of the dtype's epsilon
  // (-1: an integer dtype).
  double relative = 0, ulps = -1;
  bool within_tolerance = false;
};

struct EnvDifference {
  std::string process;  // "r0.main"
  std::string key;      // flattened: "determinism.deterministic_algorithms", "env.OMP_NUM_THREADS"
  std::string a, b;     // JSON text; "(absent)" when missing
};

// A replaced region's values handed on (docs/report.md, "Numerics"): what each side's ops there
// made that an op after the region reads, matched against what the other side's region made:
// by digest, else the nearest by statistics among those of the same shape.
struct RegionValues {
  uint64_t handed_on = 0;  // both sides'
  uint64_t exact = 0;      // equal bit for bit to one of the other side's
  uint64_t within = 0;     // else within the tolerance of the nearest of its shape and dtype
  uint64_t beyond = 0;     // else beyond it
  uint64_t unmatched = 0;  // the other side's region made none of its shape
  uint64_t made = 0;       // values both sides' ops returned; 0 for autograd's view nodes
  // The furthest of those beyond the tolerance (or within it, when none is beyond).
  double relative = 0, ulps = -1;
  std::string op_a, op_b, dtype;  // the ops that made that pair, in runs A and B
  // Every value handed on that has a counterpart is within the tolerance of it, and one has:
  // the region is the same computation, other ops. A value without one (a cast of a parameter
  // saved for backward) is not compared here; what it reaches is, after the region.
  bool matched() const { return handed_on > unmatched && beyond == 0; }
  // Every value handed on is equal bit for bit to one of the other side's.
  bool same_bits() const { return handed_on > 0 && exact == handed_on; }
};

struct StructuralDifference {
  std::string stream;
  uint64_t step = 0;
  std::string phase;
  uint64_t index_a = 0, index_b = 0;  // op positions in the stream
  uint64_t order_a = 0, order_b = 0;
  std::string op_a, op_b;                 // "" when that side has none there
  uint64_t skipped_a = 0, skipped_b = 0;  // ops of each side with no counterpart
  std::string detail;
  // Ops of both sides replaced by other ops (skipped_a and skipped_b > 0), realigned after.
  std::optional<RegionValues> values;
  // Ops only one side ran (a mask built where the other run's kernel takes is_causal): how many
  // values they make that the ops after them read. Those ops and regions are compared, so what
  // these hand on shows there; 0 when nothing after them reads one.
  uint64_t extra_values_read = 0;
  // What it hands on is the other run's bits, or its ops return no value at all.
  bool hands_on_same_bits() const { return values && (values->same_bits() || values->made == 0); }
  // Bit for bit, it changes nothing by itself: the ops after it decide. Ops only one run ran
  // stay the first divergence if any op after them differs, as they may be why.
  bool same_bits() const { return hands_on_same_bits() || extra_values_read > 0; }
};

struct CatalogRef {
  std::string id, op, condition, remedy, uncertainty;
  bool uncertain = false;
  std::vector<std::string> conditions_met, conditions_unknown, sources;
};

struct RemedyVerification {
  struct Round {
    int round = 0;
    std::string flags;                      // the settings applied so far ("--deterministic on")
    std::string runs;                       // where its two runs are
    Verdict verdict = Verdict::kIdentical;  // of their diff
    std::string first;                      // its first divergence, "" if none
  };
  bool verified = false;  // the last round's runs are identical
  std::string
      outcome;        // one line: "verified: identical with --deterministic on (181 ops compared)"
  std::string flags;  // what made them identical, when verified
  std::vector<Round> rounds;
};

// `run --selftest`: a change planted in an extra run for each of forward, backward and optimizer,
// and where the diff against run-0 first saw it (run/selftest.h).
struct SelfTest {
  struct Plant {
    std::string phase;   // forward | backward | optimizer: the op's
    std::string kind;    // the phase whose value was changed, or "silent" (run/selftest.h)
    std::string op;      // in run-0: its name, stream, index and step
    std::string stream;  // run-0's
    uint64_t index = 0, step = 0;
    std::string run;       // the plant's run directory
    std::string value;     // what was changed: "output 0", "written argument exp_avgs[2]"
    bool declared = true;  // the op's schema says it writes that value
    double before = 0, after = 0;
    // found (at its op and step) | late (after it: a blind spot) | not-found | not-planted
    // (the op made no value to change) | not-reached (the run took another path) | preceded
    // (the runs differ before the plant)
    std::string outcome;
    std::string
        seen_at;       // the diff's first divergence: "r0.main.t-main step 3 aten::add_ (op #812)"
    std::string line;  // one sentence for the report
  };
  std::vector<Plant> plants;
  std::vector<std::string> notes;  // phases no plant was chosen for, and why
  bool passed = false;             // every plant made was found (late counts, named); at least one
  std::string outcome;             // "3 of 3 plants found at their op"
  // Each plant's outcome counts as a failure of the audit (exit 6).
  static bool fails(const std::string& outcome) {
    return outcome == "not-found" || outcome == "not-reached" || outcome == "preceded";
  }
};

// `run --validate`: the program run twice more with the interposer attached and no step recorded,
// and the final parameters and optimizer state they leave compared (run/validate.h).
struct Validation {
  std::string runs;        // their directory
  bool compared = false;   // both left a final state
  bool identical = false;  // ... and it is the same
  uint64_t tensors = 0;    // tensors compared
  std::string difference;  // the first that differs: "rank 0 optimizer 0 SGD....params[3]"
  // Recording hid a divergence the unrecorded runs show; the sentinel's pair, tried then.
  bool hidden = false;
  std::string sentinel;  // what the sentinel's runs said: "shows it: first at step 3 ..."
  bool failed = false;   // hidden, or not compared: a failed audit (exit 6)
  std::string outcome;   // one line
};

// `run --sentinel`: the first divergent step, found from traces of what each step leaves
// (parameters, gradients, optimizer state, loss), then that step recorded in full (run/sentinel.h).
struct SentinelFinding {
  std::string runs;              // the sentinel runs' directory
  bool divergent = false;        // some step differs
  uint64_t steps_divergent = 0;  // steps with a difference
  uint64_t step = 0;             // the first one
  std::string first;  // what differed first there: "r0.main.t-main aten::add_ (optimizer)"
  std::vector<std::string> tensors;  // that op's differing tensors, with shapes and L2 in A and B
  std::string generator;   // the first step whose generator state differs (STEP records), or ""
  std::string full_runs;   // where that step and the one before were recorded in full
  std::string full_steps;  // "899-900"
  bool came_back = false;  // the full recording diverged too: the report is its diff
  // Rounds whose full recording parted before its window: the race fired earlier there.
  std::vector<std::string> moved;
  std::string note;                      // when it did not: what that means
  std::string command;                   // records from the step before on
  std::vector<std::string> catalog_ops;  // catalog ops that ran in those steps, when it did not
};

struct FirstDivergence {
  // Where it is: the comparator's, as it finds the first divergent op (first_divergence.h).
  std::string stream, process;
  int64_t rank = 0;
  uint64_t step = 0;
  std::string phase;
  std::string op;                  // innermost divergent op
  std::vector<std::string> chain;  // outermost first, ending with op
  std::string scope_path;          // the user scopes around it ("train/backward_block"), or ""
  // The optimizer whose step ends this step (its 1-based place by first step among the
  // optimizers that stepped in the steps compared, of how many, its class and parameter
  // tensors), where detaudit's Python hooks labelled it (torch 2.x); optimizer_ordinal 0
  // otherwise.
  uint64_t optimizer_ordinal = 0, optimizers = 0, optimizer_tensors = 0;
  std::string optimizer;
  // A torch.compile kernel (inductor_kernel::<kernel>): the aten ops it was generated from, and
  // "; atomic adds" when its code adds with atomics. "" for any other op.
  std::string kernel_origin;
  uint64_t index = 0;  // position of the op in run A's stream (0-based)
  uint64_t order_a = 0, order_b = 0;
  uint64_t offset_a = 0, offset_b = 0;
  // The collectives of its stream around it, by process group: the last one before it (or the
  // op itself) and the first one from it on, by sequence number. They order divergences of
  // different ranks: one that precedes a collective its rank joined happened before one that
  // follows the same collective on another rank.
  std::map<uint64_t, uint64_t> collectives_before, collectives_after;

  // What the records show of it: the tensors paired, and what was found about them
  // (evidence.h, first_divergence.h, roles.h).
  struct Evidence {
    std::string detail;  // one line of evidence
    // Why it counts: what read the differing bytes first ("read by aten::mul (op #15, step
    // 0)"), or why the diff could not rule a read out ("not overwritten before the stream
    // ended").
    std::string confirmed_by;
    bool nested = false;  // structural: every differing op is inside ops both runs ran
    // structural: other ops for the same values, every value they hand on equal bit for bit
    bool same_values = false;
    bool args_differ = false;
    bool is_random = false;
    uint64_t rng_a = 0, rng_b = 0;
    std::vector<TensorPair> inputs, outputs;
    std::vector<StatsDelta> magnitude;
    // The torch.compile region that ran last in this step before the op, if any: where a
    // difference in a "compiled" input arose.
    std::string compiled_region;
    bool arose_in_compiled_region = false;  // the differing input was that region's output
    // Made in a DataLoader worker: where the consumer read the batch ("r0.main.t-main at
    // aten::linear (op #12, step 0)"); empty otherwise.
    std::string batch_read_by;
    // external-input from a non-tensor argument: its values in A and B ("0.5 vs 0.25").
    std::string scalar_argument;
    // external-input: the differing input is a different one of the same recorded tensors.
    bool data_order = false;
    bool data_order_through_view = false;  // the differing input is a view of such an output
    bool hash_seed_unset = false;  // PYTHONHASHSEED unset in run A's Python process (data order)
    // shared-memory: another recorded process's first write into shared memory of the input's
    // geometry, "r0.main.1.t-main at aten::add_ (op #40, step 0)"; empty if none was recorded.
    std::string shared_writer;
    // remote-input: the collective that received the different data ("c10d::allreduce_ #12 of
    // group 0").
    std::string received_through;
    // Where the difference went from here: the collectives through which other ranks received
    // it ("c10d::allreduce_ #12 of group 0 to rank 0, step 1").
    std::vector<std::string> propagated_through;
    // Whether a path from its differing tensors reaches a training-state write, from run A's
    // data flow (roles.h); known once that stream was read for it.
    struct Training {
      bool known = false;
      bool reaches = false;
    } training;
  } evidence;

  // What kind it is: classify.h's, the one place that sets it.
  DivergenceClass divergence_class = DivergenceClass::kNone;

  // Why, and what to change: read from the class and the evidence (explain.h, resume.h).
  struct Explanation {
    std::optional<CatalogRef> catalog;
    std::string cause;  // the likely cause, when one is named
    std::string remedy;
  } explanation;
};

// Whether the differences reach the training state: parameters, gradients, optimizer state and
// model buffers (roles.h). The training gate (--fail-on training) passes on `identical`.
struct TrainingCheck {
  uint64_t writes_compared = 0;    // training-state writes compared (the optimizer's, tracked)
  uint64_t divergent_writes = 0;   // divergent ops that write training state
  uint64_t divergent_outside = 0;  // divergent ops that write none
  // The first few of those, with their step: "aten::add_ (step 4)".
  std::vector<std::string> outside;
  static constexpr size_t kMaxOutside = 5;
  // Something differs, none of it training state, and training state was compared: every
  // training write agrees, the op sequences too, and the first divergence reaches none.
  bool identical = false;
};

// One step of the divergence curve.
struct StepPoint {
  uint64_t divergent_ops = 0;
  // The largest relative difference among the step's divergent outputs, from their statistics:
  // max over min, max, mean and L2 of |b - a| / max(|a|, |b|). 0 when the statistics agree (a
  // difference below float32 statistics) or there are none.
  double max_relative = 0;
};

// The loss of one step, where one is found: the scalar that backward starts from (the input of
// the `ones_like` just before the step's first backward op), in run A and run B.
struct LossPoint {
  double a = 0, b = 0;
};

struct ParameterDivergence {
  std::string stream;
  uint64_t position = 0;  // k-th tensor the step's optimizer-phase ops wrote in place
  std::string op;
  uint64_t first_step = 0;
};

struct Truncation {
  std::string run;  // "a" or "b"
  std::string stream, file;
  uint64_t offset = 0;
  std::string message;
  uint64_t ops_compared = 0;  // aligned ops of that stream compared before the cut
};

// A difference no op read: every differing tensor was overwritten in full first. Not a
// divergence; the first one is reported so that it is not silent.
// Where the numerics first left the gate's tolerance (diff --fail-on tolerance): the first op
// whose outputs are beyond it while every input it read is within it. Errors that grow from
// there are this op's amplification, not its inputs'.
// One divergent op of the step where the numerics changed, from that op on: how the error grows
// layer by layer (docs/report.md, "Numerics").
struct GrowthPoint {
  uint64_t index = 0;  // in the stream
  std::string op, phase;
  double relative = 0;  // its furthest output's move, as a fraction of its scale
};

struct NumericsChange {
  std::string stream;
  int64_t rank = 0;
  uint64_t step = 0, index = 0;
  std::string phase, op;
  std::string tensor, dtype;  // the output furthest out: "output 0", "float32"
  double output_relative = 0, output_ulps = -1;
  // The op that made run B's value, where run B ran other ops for it (a replaced region);
  // "" when both ran `op`.
  std::string replaced_by;
  std::string input;  // the input furthest out; "" when every input agrees
  double input_relative = 0, input_ulps = -1;
  // The stream's divergent ops of `step` from this one on, in order (the first kMaxGrowth).
  std::vector<GrowthPoint> growth;
  static constexpr size_t kMaxGrowth = 400;
};

struct UnreadDifference {
  std::string stream;
  uint64_t step = 0;
  std::string op;
  uint64_t index = 0;          // in run A's stream
  std::string overwritten_by;  // "aten::zero_ (op #14)"
};

struct StreamSummary {
  std::string name;
  std::string digest;  // the algorithm both runs recorded it with ("md5", "device", ...)
  bool in_a = false, in_b = false;
  uint64_t ops_a = 0, ops_b = 0, compared = 0, divergent = 0, structural = 0;
  uint64_t unread = 0;  // differences overwritten before any op read them
  bool truncated = false;
  bool alignment_lost = false;  // no resynchronisation found within the window
  // A DataLoader worker's stream: compared up to this step, the last its consumer ran. Batches
  // it made for later steps were prefetched when the loop stopped, as many as timing allowed.
  std::optional<uint64_t> consumer_last_step;
  // torch.compile regions that ran (either run): opaque, a difference inside one shows only at
  // its outputs.
  std::vector<std::string> compiled_regions;
  // Of them, the generated kernel calls recorded as ops (inductor_kernel::<kernel>), by run.
  uint64_t compiled_kernels = 0;
  uint64_t compiled_kernels_b = 0;
};

// How one recorded process of a run ended, when that was not a plain exit, or its run failed.
struct ProcessEndingReport {
  std::string process;  // "r1.main"
  int64_t rank = 0;
  // "killed by SIGABRT", "interrupted by SIGTERM", "exited", or "no end recorded" (killed with
  // no chance to say so: SIGKILL, the OOM killer, a lost node)
  std::string ended;
  std::string detail;     // one line: how, on which thread, inside which op, while exiting
  std::string thread;     // the thread the signal stopped, "" if it recorded nothing
  std::string inside_op;  // the op that thread was inside; "" when after its last recorded op
  uint64_t inside_step = 0;
  bool recorded_ending = false;  // its .status says how it ended
  bool exiting = false;          // it was already exiting (after the program's last line)
  // Its last recorded op: the last to end among its streams, by program order.
  bool any_op = false;
  std::string last_stream, last_op;
  uint64_t last_step = 0, last_index = 0;
  // Every stream it wrote ends with an END record (a crash's included): nothing it recorded is
  // missing.
  bool streams_whole = true;
};

struct RunEnding {
  std::string run;      // "A" or "B"
  std::string program;  // how the program ended, from run.json ("exit code 1"); "" if unknown
  bool failed = false;
  std::vector<ProcessEndingReport> processes;  // those that did not exit cleanly
};

// Whether a run holds every rank of its world (src/diff/world.h).
struct WorldCheck {
  std::string run;                      // "A" or "B"
  int64_t world_size = 0;               // the largest WORLD_SIZE (or SLURM_NTASKS) a rank saw
  std::vector<int64_t> missing;         // ranks of the world, selected to record, with no trace
  std::vector<std::string> unfinished;  // "n1 (ranks 2, 3)": a node whose launcher never finished
};

// A process that resumed the training of the one before it from a checkpoint (resume.h).
struct ResumedProcess {
  int run = 1;             // whose process resumed: 0 run A's, 1 run B's
  std::string process;     // "r0.main~1"
  std::string continues;   // "r0.main", the process before it, in both runs
  uint64_t step = 0;       // the step it resumed at, in the other run's numbering
  std::string found_by;    // how that step was found
  uint64_t setup_ops = 0;  // its ops before it (building the model, loading the checkpoint)
  bool verified = false;   // the runs are identical, the resumed part included
  // Training continues exactly: verified, or only values outside training differ (TrainingCheck).
  bool training_verified = false;
  // Ops of its first step that held the same values as the other run's in another order (a
  // buffer laid out anew: DDP's gradient buckets), not counted (note_fresh_layouts).
  uint64_t reordered_ops = 0;
  // Its DataLoader workers ("r0.main.0~1"): not paired by name, their batches compared where
  // its main thread reads them.
  std::vector<std::string> workers;
  std::string missing;  // what the checkpoint did not restore, when the divergence says
};

struct DiffReport {
  // Data-parallel replicas within each run (run A's, then run B's): src/diff/replicas.h.
  std::vector<ReplicaCheck> replicas;
  std::string run_a, run_b;
  Verdict verdict = Verdict::kIdentical;
  // Why a divergence could not be traced to a first divergent op (verdict "unexplained").
  std::string unexplained;
  // Why nothing diverging would be no pass (diff.h's why_no_verdict), and what to do; the
  // verdict is "no-verdict" when nothing diverged.
  std::string no_verdict;
  // What run A's compared streams show of its training (OpSource): the steps, the backward
  // passes of the stream with most, and the optimizer ops.
  uint64_t steps_seen = 0, backward_passes = 0, optimizer_ops = 0;
  GateConfig gate;
  bool beyond_tolerance = false;  // some divergence exceeds the gate's rtol/atol
  // With the tolerance gate between two torch builds: op sequence differences, listed, not counted.
  bool structure_tolerated = false;
  // Op sequence differences that replaced ops with others for the same values (RegionValues).
  uint64_t structure_matched = 0;
  // Of those, regions whose every value handed on is the same bits (RegionValues::same_bits):
  // with nothing else differing, a refactor that computes what the other run did.
  uint64_t structure_same_bits = 0;
  bool sentinel_runs = false;  // both runs recorded each step's end only (--sentinel)
  std::vector<EnvDifference> environment;
  std::optional<FirstDivergence> first;
  std::vector<StructuralDifference> structural;  // the first few, in stream order
  uint64_t structural_count = 0;
  uint64_t divergent_ops = 0;
  std::map<uint64_t, uint64_t> divergent_ops_per_step;
  std::map<uint64_t, StepPoint> curve;                                // by step
  std::map<int64_t, std::map<uint64_t, LossPoint>> loss;              // rank -> step
  std::map<int64_t, std::map<uint64_t, uint64_t>> divergent_by_rank;  // rank -> step -> ops
  std::map<std::string, std::vector<uint64_t>> divergent_orders;      // stream -> run A's orders
  std::vector<ParameterDivergence> parameters;  // first divergent step per parameter
  uint64_t parameters_tracked = 0;
  TrainingCheck training;
  uint64_t unread_differences = 0;
  std::optional<UnreadDifference> first_unread;
  std::optional<NumericsChange> numerics_change;  // with the tolerance gate
  std::vector<Truncation> truncated;
  // What was not compared: streams cut short (no END record) and streams in one run only, one
  // line each. Unless the gate allows truncation, any of them makes the comparison incomplete.
  std::vector<std::string> not_compared;
  bool incomplete = false;
  // Streams compared otherwise than op by op, said once: library thread pools (library_threads.h).
  std::vector<PoolComparison> library_pools;
  std::vector<WorldCheck> worlds;           // run A's, run B's
  std::vector<FirstDivergence> candidates;  // DiffOptions::part: each stream's own first
  std::vector<RankFolds> replica_folds[2];  // DiffOptions::part: run A's ranks', run B's
  std::vector<std::string> notes;
  std::vector<ResumedProcess> resumes;
  // How each run ended, when a program failed or a process did not exit cleanly (src/diff/endings.h);
  // empty otherwise.
  std::vector<RunEnding> endings;
  // `run --verify-remedy`: the remedy applied as run's settings and its runs diffed (cli/run.cpp).
  std::optional<RemedyVerification> remedy_verification;
  std::optional<SelfTest> selftest;      // `run --selftest`
  std::optional<Validation> validation;  // `run --validate`
  std::optional<SentinelFinding> sentinel;
  std::vector<StreamSummary> streams;
  uint64_t ops_compared = 0, records_a = 0, records_b = 0, bytes_read = 0;
  double seconds = 0;
};

// The earlier of the report's numerics change and c: by step, then rank, then position.
inline void keep_earliest_numerics_change(NumericsChange c, DiffReport* r) {
  const auto key = [](const NumericsChange& n) { return std::tie(n.step, n.rank, n.index); };
  if (!r->numerics_change || key(c) < key(*r->numerics_change)) r->numerics_change = std::move(c);
}

}  // namespace detaudit

// fmt::format("{}", verdict) writes its name.
template <>
struct fmt::formatter<detaudit::Verdict> : fmt::formatter<std::string_view> {
  auto format(detaudit::Verdict v, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(detaudit::verdict_name(v), ctx);
  }
};

// fmt::format("{}", divergence_class) writes its name.
template <>
struct fmt::formatter<detaudit::DivergenceClass> : fmt::formatter<std::string_view> {
  auto format(detaudit::DivergenceClass c, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(detaudit::divergence_class_name(c), ctx);
  }
};
