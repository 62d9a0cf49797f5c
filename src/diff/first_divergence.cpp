#include "diff/first_divergence.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>

#include "diff/classify.h"
#include "trace/reader.h"

namespace detaudit {

namespace {

// x happened before y: x's rank joined a collective after x that y's rank had joined before y.
bool happened_before(const FirstDivergence& x, const FirstDivergence& y) {
  if (x.rank == y.rank) return false;
  for (const auto& [group, seq] : x.collectives_after) {
    auto it = y.collectives_before.find(group);
    if (it != y.collectives_before.end() && seq <= it->second) return true;
  }
  return false;
}

// Without a collective between them, the earlier step, then the lower rank.
bool earlier(const FirstDivergence& x, const FirstDivergence& y) {
  if (x.step != y.step) return x.step < y.step;
  if (x.rank != y.rank) return x.rank < y.rank;
  if (x.process != y.process) return x.process < y.process;  // "r0.main" before its workers
  return x.order_a < y.order_a;
}

// The first op of a worker stream in `path` with an output of this digest (hex): where a batch
// that a consumer read was made. Returns its step, or nullopt.
std::optional<uint64_t> find_output_digest(const std::string& path, const std::string& digest) {
  trace::TraceReader r;
  if (!r.open(path).ok()) return std::nullopt;
  while (r.next() == trace::ReadResult::kRecord) {
    if (r.kind() != trace::RecordKind::kOp) continue;
    for (int64_t id : r.op().output_tensors)
      if (const trace::TensorDesc* t = r.tensor(id); t && t->digest_hex() == digest)
        return r.op().step;
  }
  return std::nullopt;
}

// A consumer's first divergence that is a batch it read from a DataLoader worker: the worker
// made the difference. Its own first divergence is reported, with where the batch was read.
void trace_to_worker(const std::map<std::string, std::string>& streams_a,
                     const std::map<std::string, StreamHead>& heads,
                     const std::map<std::string, const FirstDivergence*>& firsts,
                     FirstDivergence* first) {
  if (first->divergence_class != DivergenceClass::kExternalInput) return;
  for (const TensorPair& in : first->evidence.inputs) {
    if (!in.differs || !in.a.present || in.a.uninitialized) continue;
    for (const auto& [name, head] : heads) {
      if (!head.dataloader_worker || parent_process(head.process) != first->process) continue;
      auto worker_first = firsts.find(name);
      if (worker_first == firsts.end()) continue;
      auto path = streams_a.find(name);
      if (path == streams_a.end() || !find_output_digest(path->second, in.a.digest)) continue;
      FirstDivergence made = *worker_first->second;
      made.evidence.batch_read_by = fmt::format("{} at {} (op #{}, step {})", first->stream,
                                                first->op, first->index, first->step);
      *first = std::move(made);
      return;
    }
  }
}

// The first divergence's first differing input is in shared memory.
bool reads_shared_memory(const FirstDivergence& f) {
  for (const TensorPair& p : f.evidence.inputs)
    if (p.differs) return p.a.in_shared_memory || p.b.in_shared_memory;
  return false;
}

// How many elements of memory a tensor's view reaches from its first: its element count when
// contiguous; an expanded view (stride 0, as addmm reads a bias) reaches only its base's.
uint64_t elements_spanned(const TensorSide& t) {
  const uint64_t numel = t.numel();
  if (t.strides.size() != t.sizes.size() || numel == 0) return numel;
  uint64_t last = 0;
  for (size_t d = 0; d < t.sizes.size(); ++d)
    last += uint64_t(t.sizes[d] - 1) * uint64_t(t.strides[d] < 0 ? -t.strides[d] : t.strides[d]);
  return std::min(numel, last + 1);
}

// A divergence at bytes in shared memory: the first op of another process of run A that wrote
// shared memory of as many elements of the input's dtype, the writer the report names. An
// external input there, written by such a process, is shared-memory too.
void find_shared_writer(const std::map<std::string, std::string>& streams_a,
                        const std::map<std::string, StreamHead>& heads, FirstDivergence* first) {
  const bool external_there = first->divergence_class == DivergenceClass::kExternalInput &&
                              !first->evidence.data_order &&
                              first->evidence.batch_read_by.empty() && reads_shared_memory(*first);
  if (first->divergence_class != DivergenceClass::kSharedMemory && !external_there) return;
  // The differing input, else (identical when the op began) the first one in shared memory.
  const TensorPair* in = nullptr;
  for (const TensorPair& p : first->evidence.inputs)
    if (p.differs && p.a.present && !in) in = &p;
  for (const TensorPair& p : first->evidence.inputs)
    if (p.a.in_shared_memory && !in) in = &p;
  if (!in) return;
  const uint64_t numel = elements_spanned(in->a);
  // A resumed process's streams are paired with the other run's under both names: its own
  // trace is not another process's.
  const auto own = streams_a.find(first->stream);
  for (const auto& [name, head] : heads) {
    auto path = streams_a.find(name);
    // A DataLoader worker's batches are data loading, which trace_to_worker follows.
    if (head.process == first->process || head.dataloader_worker || path == streams_a.end() ||
        (own != streams_a.end() && path->second == own->second))
      continue;
    trace::TraceReader r;
    if (!r.open(path->second).ok()) continue;
    while (r.next() == trace::ReadResult::kRecord) {
      if (r.kind() != trace::RecordKind::kOp) continue;
      for (int64_t id : r.op().output_tensors) {
        const trace::TensorDesc* t = r.tensor(id);
        if (!t || t->sharing == trace::Sharing::kNone || t->numel() != numel ||
            trace::dtype_name(t->dtype) != in->a.dtype)
          continue;
        first->evidence.shared_writer = fmt::format("{} at {} (step {})", name,
                                                    r.string(r.op().name), r.op().step);
        if (external_there) classify_shared_writer(in->index, first);
        return;
      }
    }
  }
}

}  // namespace

const FirstDivergence* causal_first(const std::vector<const FirstDivergence*>& candidates) {
  // Other ops that handed on the same bits are first only where no stream's values differ.
  std::vector<const FirstDivergence*> valued;
  for (const FirstDivergence* c : candidates)
    if (!c->evidence.same_values) valued.push_back(c);
  const auto& among = valued.empty() ? candidates : valued;
  const FirstDivergence* first = nullptr;
  for (const FirstDivergence* c : among) {
    bool preceded = false;
    for (const FirstDivergence* o : among) preceded = preceded || happened_before(*o, *c);
    if (!preceded && (!first || earlier(*c, *first))) first = c;
  }
  return first;
}

void add_spread(const std::vector<const FirstDivergence*>& candidates, FirstDivergence* first) {
  std::vector<const FirstDivergence*> reached;
  for (const FirstDivergence* c : candidates)
    if (c->divergence_class == DivergenceClass::kRemoteInput && happened_before(*first, *c))
      reached.push_back(c);
  // By rank, not by stream name ("r10" before "r2").
  std::stable_sort(reached.begin(), reached.end(),
                   [](const FirstDivergence* x, const FirstDivergence* y) {
                     return std::pair(x->rank, x->step) < std::pair(y->rank, y->step);
                   });
  for (const FirstDivergence* c : reached)
    first->evidence.propagated_through.push_back(
        fmt::format("{} to rank {}, step {}", c->evidence.received_through, c->rank, c->step));
}

const FirstDivergence* choose_first(const std::vector<const FirstDivergence*>& candidates,
                                    const std::map<std::string, StreamHead>& heads) {
  const FirstDivergence* first = causal_first(candidates);
  if (!first || !reads_shared_memory(*first)) return first;
  const FirstDivergence* child = nullptr;
  // A DataLoader worker's batch is followed the other way, by trace_to_worker.
  for (const FirstDivergence* c : candidates)
    if (auto head = heads.find(c->stream); c->process.rfind(first->process + ".", 0) == 0 &&
                                           head != heads.end() && !head->second.dataloader_worker &&
                                           (!child || earlier(*c, *child)))
      child = c;
  return child ? child : first;
}

void trace_origin(const StreamSelection& selection,
                  const std::map<std::string, const FirstDivergence*>& firsts,
                  FirstDivergence* first) {
  trace_to_worker(selection.streams[0], selection.heads, firsts, first);
  find_shared_writer(selection.streams[0], selection.heads, first);
}

std::string why_no_first(const std::vector<const FirstDivergence*>& candidates, uint64_t ops,
                         const std::vector<PoolComparison>& pools) {
  for (const PoolComparison& c : pools)
    if (candidates.empty() && (c.unmatched_a || c.unmatched_b))
      return fmt::format(
          "only ops of {}'s {} threads differ ({} of run A, {} of run B unmatched; "
          "the first: {} in step {}), and those are compared as a set, with no "
          "order to name a first by",
          c.process, c.pool->thread, c.unmatched_a, c.unmatched_b, c.first_unmatched_op,
          c.first_unmatched_step);
  if (candidates.empty())
    return fmt::format("{} divergent ops were counted, but no stream held a first divergence", ops);
  std::vector<std::string> each;
  for (const FirstDivergence* c : candidates)
    each.push_back(fmt::format(
        "rank {} step {} {} ({}{}{})", c->rank, c->step, c->op, c->divergence_class,
        c->evidence.received_through.empty() ? "" : " at ", c->evidence.received_through));
  return fmt::format(
      "every candidate follows another through a collective, so none came first: "
      "{}",
      fmt::join(each, "; "));
}

}  // namespace detaudit
