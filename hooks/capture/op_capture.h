// hooks/capture: `detaudit replay`'s side in the program: one op's inputs saved in a new run, and
// the replayer that calls the op again on them.
//
// `detaudit replay`'s capture: the inputs of one recorded op, saved when a run of the same command
// reaches the same op. DETAUDIT_CAPTURE names the spec the CLI writes (src/replay/replay.h):
//
//   {"process": "r0.main", "thread": "main", "op": "aten::_index_put_impl_", "occurrence": 3,
//    "inputs": ["<hex digest>", "", ...], "dir": "/abs/replay/capture"}
//
// The op is the `occurrence`-th op of that name (from 0, in start order) that the thread records.
// Its inputs must have the record's digests ("" is not compared): then they are saved, as the
// op received them, with torch::pickle_save (torch.load and torch::pickle_load read it) to
// <dir>/inputs.pt. <dir>/capture.json says what happened, in every case where the op was reached.
#pragma once

#include <ATen/record_function.h>

#include <string>
#include <vector>

namespace detaudit::hooks {

struct CaptureSpec {
  std::string process, thread, op;
  uint64_t occurrence = 0;
  std::vector<std::string> inputs;  // hex, "" where not compared
  std::string dir;
};

// Parsed once from the environment; nullptr when not capturing (or the spec is unreadable, which
// <dir>/capture.json then says, if it named a dir).
const CaptureSpec* capture_spec();

// The op was reached (name and occurrence match on the named thread of the named process):
// compares `digests` (the recorder's input digests in argument order, lists expanded, "" where it
// has none) and saves the inputs. Once per process; never throws.
void capture_op(const CaptureSpec& spec, const at::RecordFunction& fn,
                const std::vector<std::string>& digests);
bool capture_done();

}  // namespace detaudit::hooks
