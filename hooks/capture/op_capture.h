// hooks/capture: the program's side of `detaudit replay` and `detaudit coverage`: recorded ops'
// inputs saved in a new run, and the replayer that calls the ops again on them.
//
// The captures of `detaudit replay` and `detaudit coverage`: the inputs of recorded ops, saved
// when a run of the same command reaches the same ops. DETAUDIT_CAPTURE names the spec the CLI
// writes (src/replay/replay.h), one target or a list of them:
//
//   {"process": "r0.main", "thread": "main", "op": "aten::_index_put_impl_", "occurrence": 3,
//    "inputs": ["<hex digest>", "", ...], "dir": "/abs/replay/capture"}
//   {"targets": [{...as above, each with a dir of its own...}, ...]}
//
// A target is the `occurrence`-th op of that name (from 0, in start order) that the thread
// records. Its inputs must have the record's digests ("" is not compared): then they are saved,
// as the op received them, with torch::pickle_save (torch.load and torch::pickle_load read it) to
// <dir>/inputs.pt, and the state of the generator the op draws from to <dir>/rng.pt, so that a
// replay of a random op starts where the recorded one did. <dir>/capture.json says what happened,
// in every case where the op was reached.
//
// A target with "plant" is `run --selftest`'s (hooks/capture/op_plant.h): the op's value is
// changed, not its inputs saved, and its "inputs" may be left out.
//
//   {"process": "r0.main", "thread": "main", "op": "aten::addmm", "occurrence": 41,
//    "plant": {"value": "output", "relative": 0.001}, "dir": "/abs/audit/selftest-forward"}
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/record_function.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace detaudit::hooks {

struct CaptureTarget {
  std::string process, thread, op;
  uint64_t occurrence = 0;
  std::vector<std::string> inputs;  // hex, "" where not compared
  std::string dir;
  // `run --selftest`: change one element of what the op wrote ("output"), or of what it read
  // ("input": a sentinel's step state, whose gradients the backward handed on), by `relative`.
  bool plant = false;
  bool plant_input = false;
  double relative = 1e-3;
};

struct CaptureSpec {
  std::vector<CaptureTarget> targets;
  std::unordered_map<std::string, std::vector<size_t>> by_op;  // op name -> its targets
  std::unique_ptr<std::atomic<bool>[]> done;                   // per target
  std::atomic<size_t> left{0};                                 // targets not yet reached
};

// Parsed once from the environment; nullptr when not capturing (or the spec is unreadable, which
// the CLI then says: it finds no capture.json).
CaptureSpec* capture_spec();

// Target `k` was reached (name and occurrence match on the named thread of the named process):
// compares `digests` (the recorder's input digests in argument order, lists expanded, "" where it
// has none) and saves the inputs, and the state of `generator` (the one the op draws from; null
// where it cannot be read). Once per target; never throws.
void capture_op(CaptureSpec& spec, size_t k, const at::RecordFunction& fn,
                const std::vector<std::string>& digests, std::optional<at::Generator> generator);
inline bool capture_done(const CaptureSpec& spec) {
  return spec.left.load(std::memory_order_relaxed) == 0;
}

}  // namespace detaudit::hooks
