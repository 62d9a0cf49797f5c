#include "diff/library_threads.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <unordered_map>

#include "trace/reader.h"

namespace detaudit {
namespace {

constexpr LibraryPool kPools[] = {
    {"pt_gloo_runloop",
     "gloo's runloop threads take each collective's work as one comes free: which thread, step "
     "or phase runs it follows timing"},
};

struct Fingerprint {
  uint64_t h = 1469598103934665603ull;
  void add(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  template <typename T>
  void add(const T& v) {
    add(&v, sizeof v);
  }
  void add(std::string_view s) {
    add(s.size());
    add(s.data(), s.size());
  }
};

void add_tensor(const trace::TraceReader& r, int64_t id, Fingerprint* f) {
  const trace::TensorDesc* t = r.tensor(id);
  if (!t) return f->add(uint8_t(0xff));
  f->add(uint8_t(t->dtype));
  f->add(t->sizes.size());
  for (int64_t s : t->sizes) f->add(s);
  // Garbage and buffers still being filled are geometry only, as everywhere in the diff.
  if (t->has_contents()) f->add(t->digest.data(), t->digest_len);
}

uint64_t fingerprint(const trace::TraceReader& r, const trace::OpRecord& op) {
  Fingerprint f;
  f.add(r.string(op.name));
  f.add(op.depth);
  f.add(op.scope_path == UINT32_MAX ? std::string_view() : r.string(op.scope_path));
  f.add(op.args_hash);
  f.add(op.results_hash);
  f.add(op.input_tensors.size());
  for (int64_t id : op.input_tensors) add_tensor(r, id, &f);
  f.add(op.output_tensors.size());
  for (int64_t id : op.output_tensors) add_tensor(r, id, &f);
  return f.h;
}

struct Tally {
  int64_t balance = 0;  // ops of run A minus ops of run B with this fingerprint
  // In the run that resumed: this op's count in the resumed process, and in its predecessor.
  uint64_t resumed = 0, predecessor = 0;
  uint64_t step_a = UINT64_MAX, order_a = 0, step_b = UINT64_MAX, order_b = 0;
  std::string name_a, name_b;
};

}  // namespace

const LibraryPool* library_pool(std::string_view thread_base) {
  for (const LibraryPool& p : kPools)
    if (thread_base == p.thread) return &p;
  return nullptr;
}

Status compare_pool(const std::vector<std::string>& paths_a,
                    const std::vector<std::string>& paths_b, PoolComparison* out) {
  std::unordered_map<uint64_t, Tally> tallies;
  for (bool in_a : {true, false}) {
    for (const std::string& path : in_a ? paths_a : paths_b) {
      const bool resumed_run = out->resumed_run == (in_a ? 0 : 1);
      const bool of_resumed = resumed_run &&
                              std::find(out->resumed_paths.begin(), out->resumed_paths.end(),
                                        path) != out->resumed_paths.end();
      trace::TraceReader r;
      if (Status s = r.open(path); !s.ok()) return s;
      trace::ReadResult res;
      while ((res = r.next()) == trace::ReadResult::kRecord) {
        if (r.kind() != trace::RecordKind::kOp) continue;
        const trace::OpRecord& op = r.op();
        Tally& t = tallies[fingerprint(r, op)];
        t.balance += in_a ? 1 : -1;
        if (resumed_run) ++(of_resumed ? t.resumed : t.predecessor);
        uint64_t& step = in_a ? t.step_a : t.step_b;
        uint64_t& order = in_a ? t.order_a : t.order_b;
        if (op.step < step || (op.step == step && op.order < order)) {
          step = op.step;
          order = op.order;
          (in_a ? t.name_a : t.name_b) = std::string(r.string(op.name));
        }
        ++(in_a ? out->ops_a : out->ops_b);
      }
      if (res == trace::ReadResult::kCorrupt) return Status::error(r.error(), ExitCode::kBadInput);
      if (res == trace::ReadResult::kTruncated || !r.saw_end()) {
        out->truncated = true;
        (in_a ? out->truncated_a : out->truncated_b) = true;
      }
    }
  }
  uint64_t first_step = UINT64_MAX, first_order = UINT64_MAX;
  for (auto& [_, t] : tallies) {
    if (out->resumed_run >= 0 && t.balance != 0 && (t.balance > 0) == (out->resumed_run == 0)) {
      const uint64_t repeats = std::min({uint64_t(std::abs(t.balance)), t.resumed, t.predecessor});
      t.balance += t.balance > 0 ? -int64_t(repeats) : int64_t(repeats);
      out->setup_repeats += repeats;
    }
    if (t.balance == 0) continue;
    const bool a = t.balance > 0;
    // An op the other run lacks, where the other run's pool was cut: its partner may be past the
    // cut.
    if (a ? out->truncated_b : out->truncated_a) {
      (a ? out->uncompared_a : out->uncompared_b) += uint64_t(a ? t.balance : -t.balance);
      continue;
    }
    (a ? out->unmatched_a : out->unmatched_b) += uint64_t(a ? t.balance : -t.balance);
    const uint64_t step = a ? t.step_a : t.step_b, order = a ? t.order_a : t.order_b;
    if (step < first_step || (step == first_step && order < first_order)) {
      first_step = step;
      first_order = order;
      out->first_unmatched_step = step;
      out->first_unmatched_op = a ? t.name_a : t.name_b;
    }
  }
  out->matched = out->ops_a - out->unmatched_a - out->uncompared_a -
                 (out->resumed_run == 0 ? out->setup_repeats : 0);
  return Status();
}

}  // namespace detaudit
