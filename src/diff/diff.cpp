// diff_runs: pairs the streams of two run directories, compares each, and merges the results
// into one report; plus the gate and the report format dispatch.
#include "diff/diff.h"

#include <fmt/format.h>

#include <cctype>
#include <chrono>
#include <map>
#include <optional>
#include <tuple>

#include "diff/classify.h"
#include "diff/comparator.h"
#include "diff/endings.h"
#include "diff/environment.h"
#include "diff/replicas.h"
#include "diff/report_model.h"
#include "diff/world.h"
#include "run_layout.h"
#include "trace/reader.h"
#include "trace/run_directory.h"
#include "util/parallel.h"

namespace detaudit {

namespace {

Status list_streams(const std::string& run_dir, std::map<std::string, std::string>* out) {
  trace::RunDirectory run;
  if (Status s = trace::RunDirectory::open(run_dir, &run); !s.ok()) return s;
  if (Status s = run.require_traces(); !s.ok()) return s;
  for (const trace::RunFile& stream : run.traces()) (*out)[stream.name] = stream.path;
  return Status();
}

// What the diff needs from a stream's header before comparing it.
struct StreamHead {
  std::string process;  // "r0.main.0"
  bool dataloader_worker = false;
};

StreamHead read_head(const std::string& path) {
  StreamHead h;
  trace::TraceReader r;
  if (!r.open(path).ok()) return h;  // compare_stream reports what is wrong with it
  h.process = layout::process_name(r.header().rank, r.header().process_role);
  h.dataloader_worker = (r.header().flags & trace::kStreamDataLoaderWorker) != 0;
  return h;
}

// "r0.main" for a worker "r0.main.0": the process that forked it.
std::string parent_process(const std::string& process) {
  size_t dot = process.rfind('.');
  return dot == std::string::npos ? process : process.substr(0, dot);
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
                     std::map<std::string, std::optional<FirstDivergence>>& firsts,
                     FirstDivergence* first) {
  if (first->divergence_class != kClassExternal) return;
  for (const TensorPair& in : first->inputs) {
    if (!in.differs || !in.a.present || in.a.uninitialized) continue;
    for (const auto& [name, head] : heads) {
      if (!head.dataloader_worker || parent_process(head.process) != first->process) continue;
      auto worker_first = firsts.find(name);
      if (worker_first == firsts.end() || !worker_first->second) continue;
      auto path = streams_a.find(name);
      if (path == streams_a.end() || !find_output_digest(path->second, in.a.digest)) continue;
      FirstDivergence made = *worker_first->second;
      made.batch_read_by = fmt::format("{} at {} (op #{}, step {})", first->stream, first->op,
                                       first->index, first->step);
      *first = std::move(made);
      return;
    }
  }
}

// The first divergence's first differing input is in shared memory.
bool reads_shared_memory(const FirstDivergence& f) {
  for (const TensorPair& p : f.inputs)
    if (p.differs) return p.a.in_shared_memory || p.b.in_shared_memory;
  return false;
}

// How many elements of memory a tensor's view reaches from its first: its element count when
// contiguous; an expanded view (stride 0, as addmm reads a bias) reaches only its base's.
uint64_t elements_spanned(const TensorSide& t) {
  uint64_t numel = 1;
  for (int64_t n : t.sizes) numel *= uint64_t(n);
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
  const bool external_there = first->divergence_class == kClassExternal && !first->data_order &&
                              first->batch_read_by.empty() && reads_shared_memory(*first);
  if (first->divergence_class != kClassSharedMemory && !external_there) return;
  // The differing input, else (identical when the op began) the first one in shared memory.
  const TensorPair* in = nullptr;
  for (const TensorPair& p : first->inputs)
    if (p.differs && p.a.present && !in) in = &p;
  for (const TensorPair& p : first->inputs)
    if (p.a.in_shared_memory && !in) in = &p;
  if (!in) return;
  const uint64_t numel = elements_spanned(in->a);
  for (const auto& [name, head] : heads) {
    auto path = streams_a.find(name);
    // A DataLoader worker's batches are data loading, which trace_to_worker follows.
    if (head.process == first->process || head.dataloader_worker || path == streams_a.end())
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
        first->shared_writer = fmt::format("{} at {} (step {})", name, r.string(r.op().name),
                                           r.op().step);
        if (external_there) {
          first->divergence_class = kClassSharedMemory;
          first->detail = fmt::format(
              "input {} is in shared memory, written outside this "
              "process: another recorded process writes it",
              in->index);
        }
        return;
      }
    }
  }
}

// What a stream's first ops are: names only, and names with output digests.
struct Signature {
  uint64_t names = 0, contents = 0;
};

Signature signature_of(const std::string& path) {
  Signature s;
  trace::TraceReader r;
  if (!r.open(path).ok()) return s;
  std::hash<std::string_view> h;
  for (int ops = 0; ops < 256 && r.next() == trace::ReadResult::kRecord;) {
    if (r.kind() != trace::RecordKind::kOp) continue;
    ++ops;
    s.names = s.names * 1099511628211ull ^ h(r.string(r.op().name));
    s.contents = s.contents * 1099511628211ull ^ h(r.string(r.op().name));
    for (int64_t id : r.op().output_tensors)
      if (const trace::TensorDesc* t = r.tensor(id))
        s.contents = s.contents * 1099511628211ull ^ h(t->digest_hex());
  }
  return s;
}

// The name without its "~<k>" marks, of the process or of the thread.
std::string base(const std::string& name) {
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '~' && i + 1 < name.size() && std::isdigit(uint8_t(name[i + 1]))) {
      while (i + 1 < name.size() && std::isdigit(uint8_t(name[i + 1]))) ++i;
      continue;
    }
    out += name[i];
  }
  return out;
}

// Threads (or processes) that claimed the same name ("thread", "thread~1") did so in the order
// the scheduler started them. Such streams pair by what they ran: the same first ops and outputs, else the
// same first op names, else in name order. Run B's streams are renamed to their partners'.
void pair_clashing_streams(const std::map<std::string, std::string>& sa,
                           std::map<std::string, std::string>* sb) {
  std::map<std::string, std::pair<std::vector<std::string>, std::vector<std::string>>> groups;
  for (const auto& [n, _] : sa) groups[base(n)].first.push_back(n);
  for (const auto& [n, _] : *sb) groups[base(n)].second.push_back(n);
  for (auto& [_, group] : groups) {
    auto& [names_a, names_b] = group;
    if (names_a.size() < 2 && names_b.size() < 2) continue;
    std::map<std::string, Signature> sig;
    for (const std::string& n : names_a) sig["a" + n] = signature_of(sa.at(n));
    for (const std::string& n : names_b) sig["b" + n] = signature_of(sb->at(n));
    std::map<std::string, std::string> partner;  // A name -> B name
    std::vector<bool> used(names_b.size());
    for (bool by_content : {true, false})
      for (const std::string& a : names_a) {
        if (partner.count(a)) continue;
        for (size_t i = 0; i < names_b.size(); ++i) {
          const Signature& x = sig["a" + a];
          const Signature& y = sig["b" + names_b[i]];
          if (used[i] || (by_content ? x.contents != y.contents : x.names != y.names)) continue;
          partner[a] = names_b[i];
          used[i] = true;
          break;
        }
      }
    size_t next = 0;
    for (const std::string& a : names_a) {
      while (!partner.count(a) && next < names_b.size()) {
        if (!used[next]) {
          partner[a] = names_b[next];
          used[next] = true;
        }
        ++next;
      }
    }
    std::map<std::string, std::string> renamed;
    for (const auto& [a, b] : partner) renamed[a] = sb->at(b);
    for (size_t i = 0; i < names_b.size(); ++i)
      if (!used[i])
        renamed[renamed.count(names_b[i]) ? names_b[i] + "#b" : names_b[i]] = sb->at(names_b[i]);
    for (const std::string& b : names_b) sb->erase(b);
    for (auto& [n, path] : renamed) (*sb)[n] = path;
  }
}

// Takes the streams of library thread pools out of `sa` and `sb`, grouped by process.
std::map<std::pair<std::string, std::string>, PoolComparison> take_pools(
    std::map<std::string, std::string>* sa, std::map<std::string, std::string>* sb,
    std::map<std::pair<std::string, std::string>,
             std::pair<std::vector<std::string>, std::vector<std::string>>>* paths) {
  std::map<std::pair<std::string, std::string>, PoolComparison> pools;
  for (auto* streams : {sa, sb}) {
    for (auto it = streams->begin(); it != streams->end();) {
      const size_t t = it->first.find(".t-");
      const LibraryPool* pool = t == std::string::npos
                                    ? nullptr
                                    : library_pool(base(it->first.substr(t + 3)));
      if (!pool) {
        ++it;
        continue;
      }
      auto key = std::pair{it->first.substr(0, t), std::string(pool->thread)};
      PoolComparison& c = pools[key];
      c.process = key.first;
      c.pool = pool;
      (streams == sa ? c.streams_a : c.streams_b).push_back(it->first);
      auto& [pa, pb] = (*paths)[key];
      (streams == sa ? pa : pb).push_back(it->second);
      it = streams->erase(it);
    }
  }
  return pools;
}

// One line for all pools of a kind: how they were compared, and what matched.
void note_pools(DiffReport* r) {
  std::map<std::string, std::vector<const PoolComparison*>> by_pool;
  for (const PoolComparison& c : r->library_pools) by_pool[c.pool->thread].push_back(&c);
  for (const auto& [thread, pools] : by_pool) {
    uint64_t a = 0, b = 0, matched = 0;
    std::vector<std::string> processes;
    for (const PoolComparison* c : pools) {
      a += c->ops_a;
      b += c->ops_b;
      matched += c->matched;
      processes.push_back(c->process);
    }
    r->notes.push_back(fmt::format(
        "{} ({}): {}; their ops were compared as one set per process, not thread by thread: {} "
        "of {} in run A matched run B's {}",
        thread, fmt::join(processes, ", "), pools.front()->pool->why, matched, a, b));
  }
}

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

}  // namespace

const FirstDivergence* causal_first(const std::vector<const FirstDivergence*>& candidates) {
  const FirstDivergence* first = nullptr;
  for (const FirstDivergence* c : candidates) {
    bool preceded = false;
    for (const FirstDivergence* o : candidates) preceded = preceded || happened_before(*o, *c);
    if (!preceded && (!first || earlier(*c, *first))) first = c;
  }
  return first;
}

void add_spread(const std::vector<const FirstDivergence*>& candidates, FirstDivergence* first) {
  std::vector<const FirstDivergence*> reached;
  for (const FirstDivergence* c : candidates)
    if (c->divergence_class == kClassRemoteInput && happened_before(*first, *c))
      reached.push_back(c);
  // By rank, not by stream name ("r10" before "r2").
  std::stable_sort(reached.begin(), reached.end(),
                   [](const FirstDivergence* x, const FirstDivergence* y) {
                     return std::pair(x->rank, x->step) < std::pair(y->rank, y->step);
                   });
  for (const FirstDivergence* c : reached)
    first->propagated_through.push_back(
        fmt::format("{} to rank {}, step {}", c->received_through, c->rank, c->step));
}

namespace {

// Why no candidate could be named first: every one follows another through a collective (two
// ranks each received a difference the other did not send), or no stream held a candidate.
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
    each.push_back(fmt::format("rank {} step {} {} ({}{}{})", c->rank, c->step, c->op,
                               c->divergence_class, c->received_through.empty() ? "" : " at ",
                               c->received_through));
  return fmt::format(
      "every candidate follows another through a collective, so none came first: "
      "{}",
      fmt::join(each, "; "));
}

bool has_base_key(const std::vector<EnvDifference>& env, const EnvDifference& d) {
  std::string base = d.key.substr(0, d.key.find(' '));
  for (const EnvDifference& e : env)
    if (e.process == d.process && e.key == base) return true;
  return false;
}

}  // namespace

Status diff_runs(const std::string& run_a, const std::string& run_b, const DiffOptions& options,
                 DiffReport* report) {
  auto start = std::chrono::steady_clock::now();
  DiffReport r;
  r.run_a = run_a;
  r.run_b = run_b;
  r.gate = options.gate;
  std::map<std::string, std::string> sa, sb;
  if (Status s = list_streams(run_a, &sa); !s.ok()) return s;
  if (Status s = list_streams(run_b, &sb); !s.ok()) return s;
  if (!options.ranks.all())
    for (auto* streams : {&sa, &sb})
      for (auto it = streams->begin(); it != streams->end();)
        it = options.ranks.contains(uint64_t(trace::rank_of_name(it->first).value_or(-1)))
                 ? std::next(it)
                 : streams->erase(it);
  std::map<std::pair<std::string, std::string>,
           std::pair<std::vector<std::string>, std::vector<std::string>>>
      pool_paths;
  auto pools = take_pools(&sa, &sb, &pool_paths);
  pair_clashing_streams(sa, &sb);
  std::map<std::string, std::map<std::string, std::string>> ea, eb;
  if (Status s = load_environment(run_a, &ea); !s.ok()) return s;
  if (Status s = load_environment(run_b, &eb); !s.ok()) return s;
  r.environment = diff_environment(ea, run_a, eb, run_b);
  if (std::string moved = placement_note(ea, eb); !moved.empty()) r.notes.push_back(moved);
  for (const auto& [run, dir, env] : {std::tuple{"A", &run_a, &ea}, std::tuple{"B", &run_b, &eb}}) {
    WorldCheck w;
    w.run = run;
    if (Status s = check_world(*dir, *env, &w); !s.ok()) return s;
    r.worlds.push_back(std::move(w));
  }

  std::map<std::string, bool> names;
  for (const auto& [n, _] : sa) names[n] = true;
  for (const auto& [n, _] : sb) names[n] = true;
  ProgressFn progress;
  if (options.progress)
    progress = [](const std::string& stream, uint64_t done, uint64_t total) {
      fmt::print(stderr, "detaudit diff: {}: {:.0f}% ({} MB)\n", stream,
                 total ? 100.0 * double(done) / double(total) : 0.0, done >> 20);
    };

  std::map<std::string, StreamHead> heads;
  for (const auto& [name, _] : names) {
    auto ia = sa.find(name);
    heads[name] = read_head(ia != sa.end() ? ia->second : sb.find(name)->second);
  }
  // Consumers first: a worker's stream is compared up to the last step its consumer ran.
  std::vector<StreamResult> results;
  std::vector<RankFolds> replica_folds[2];                         // run A's ranks, run B's
  std::map<std::string, std::pair<uint64_t, uint64_t>> last_step;  // by process: A, B
  for (bool workers : {false, true}) {
    std::vector<std::string> batch;
    std::vector<StreamLimits> limits;
    for (const auto& [name, _] : names) {
      const StreamHead& head = heads[name];
      if (head.dataloader_worker != workers) continue;
      StreamLimits l;
      l.world_lost_a = lost_world(r.worlds[0]);
      l.world_lost_b = lost_world(r.worlds[1]);
      if (workers) {
        if (auto it = last_step.find(parent_process(head.process)); it != last_step.end()) {
          l.last_step_a = it->second.first;
          l.last_step_b = it->second.second;
        }
      }
      batch.push_back(name);
      limits.push_back(l);
    }
    std::vector<StreamResult> done(batch.size());
    // Each rank's main thread is folded for the replica check as it is read: nothing twice.
    std::vector<RankFolds> fold_a(batch.size()), fold_b(batch.size());
    std::vector<ReplicaFolder> folder_a, folder_b;
    for (size_t i = 0; i < batch.size(); ++i) {
      folder_a.emplace_back(&fold_a[i]);
      folder_b.emplace_back(&fold_b[i]);
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      const std::string& process = heads[batch[i]].process;
      if (workers || batch[i] != process + ".t-main" || process.find('.') + 5 != process.size())
        continue;  // not "r<rank>.main.t-main"
      limits[i].on_op_a = [f = &folder_a[i]](const trace::TraceReader& rd,
                                             const trace::OpRecord& op) { f->op(rd, op); };
      limits[i].on_op_b = [f = &folder_b[i]](const trace::TraceReader& rd,
                                             const trace::OpRecord& op) { f->op(rd, op); };
      for (auto [folds, streams] : {std::pair{&fold_a, &sa}, std::pair{&fold_b, &sb}}) {
        RankFolds& f = (*folds)[i];
        f.rank = trace::rank_of_name(process).value_or(-1);
        f.name = batch[i];
        auto it = streams->find(batch[i]);
        f.path = it == streams->end() ? "" : it->second;
      }
    }
    // Each stream's comparison is its own, in bounded memory: one a core.
    Status s = for_each_parallel(batch.size(), options.threads, [&](size_t i) {
      const std::string& name = batch[i];
      auto ia = sa.find(name), ib = sb.find(name);
      auto fingerprint = ea.find(heads.at(name).process);
      return ia != sa.end() && ib != sb.end()
                 ? compare_stream(name, ia->second, ib->second, options, r.environment, progress,
                                  &done[i], limits[i],
                                  fingerprint != ea.end() ? &fingerprint->second : nullptr)
                 : count_stream(name, ia != sa.end() ? ia->second : ib->second, ia != sa.end(),
                                &done[i], ia != sa.end() ? limits[i].on_op_a : limits[i].on_op_b);
    });
    if (!s.ok()) return s;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!limits[i].on_op_a) continue;
      if (!fold_a[i].path.empty()) replica_folds[0].push_back(std::move(fold_a[i]));
      if (!fold_b[i].path.empty()) replica_folds[1].push_back(std::move(fold_b[i]));
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      StreamResult& res = done[i];
      const StreamHead& head = heads[batch[i]];
      // A worker stream in one run only whose first batch is for a step its consumer never
      // ran: prefetched as timing allowed, not a difference of the program.
      if (workers && res.unpartnered_first_step) {
        const auto& limit = res.summary.in_a ? limits[i].last_step_a : limits[i].last_step_b;
        if (limit && *res.unpartnered_first_step > *limit) res.summary.consumer_last_step = *limit;
      }
      if (!workers) {
        auto [it, added] = last_step.try_emplace(head.process, res.max_step_a, res.max_step_b);
        if (!added) {
          it->second.first = std::max(it->second.first, res.max_step_a);
          it->second.second = std::max(it->second.second, res.max_step_b);
        }
      }
      results.push_back(std::move(res));
    }
  }
  std::map<std::string, std::optional<FirstDivergence>> firsts;
  for (const StreamResult& res : results) firsts[res.summary.name] = res.first;

  for (StreamResult& res : results) {
    for (EnvDifference& d : res.step_settings)
      if (!has_base_key(r.environment, d)) r.environment.push_back(std::move(d));
  }
  // The first divergence: one no other happened before (collectives order ranks), else the
  // earliest by step and rank. A difference another rank received is reported at its origin.
  std::vector<const FirstDivergence*> candidates;
  for (const StreamResult& res : results)
    if (res.first) candidates.push_back(&*res.first);
  if (options.part)
    for (const FirstDivergence* c : candidates) r.candidates.push_back(*c);
  const FirstDivergence* first = causal_first(candidates);
  // Shared bytes a parent reads (Hogwild's final parameters) were written by its children, which
  // read each other's writes first.
  if (first && reads_shared_memory(*first)) {
    const FirstDivergence* child = nullptr;
    // A DataLoader worker's batch is followed the other way, by trace_to_worker.
    for (const FirstDivergence* c : candidates)
      if (c->process.rfind(first->process + ".", 0) == 0 && !heads[c->stream].dataloader_worker &&
          (!child || earlier(*c, *child)))
        child = c;
    if (child) first = child;
  }
  if (first) {
    r.first = *first;
    add_spread(candidates, &*r.first);
  }
  std::vector<std::vector<StreamTail>> tails(2);
  for (const StreamResult& res : results) {
    const std::string& process = heads[res.summary.name].process;
    for (int side = 0; side < 2; ++side) {
      if (!(side == 0 ? res.summary.in_a : res.summary.in_b)) continue;
      const StreamResult::Tail& t = side == 0 ? res.tail_a : res.tail_b;
      tails[side].push_back({res.summary.name, process, res.rank, t.ended, t.any_op, t.last_op,
                             t.last_step, t.last_index, t.last_order});
    }
  }
  for (StreamResult& res : results) {
    for (StructuralDifference& d : res.structural)
      if (r.structural.size() < kMaxStructural) r.structural.push_back(std::move(d));
    r.structural_count += res.structural_count;
    r.divergent_ops += res.divergent_ops;
    r.divergent_by_rank[res.rank];  // every rank gets a lane, divergent or not
    if (!res.divergent_orders.empty())
      r.divergent_orders[res.summary.name] = std::move(res.divergent_orders);
    for (const auto& [step, n] : res.per_step) {
      r.divergent_ops_per_step[step] += n;
      r.divergent_by_rank[res.rank][step] += n;
    }
    for (const auto& [step, p] : res.curve) {
      StepPoint& q = r.curve[step];
      q.divergent_ops += p.divergent_ops;
      q.max_relative = std::max(q.max_relative, p.max_relative);
    }
    // A rank's loss is its first stream's that has one: the main thread's, as a rule.
    if (!res.loss.empty() && !r.loss.count(res.rank)) r.loss[res.rank] = res.loss;
    for (ParameterDivergence& p : res.parameters) r.parameters.push_back(std::move(p));
    r.parameters_tracked += res.parameters_tracked;
    r.unread_differences += res.unread;
    if (!r.first_unread && res.first_unread) r.first_unread = std::move(res.first_unread);
    for (const Truncation& t : res.truncated)
      r.not_compared.push_back(
          fmt::format("run {} stream {} was cut short after {} compared ops "
                      "({})",
                      t.run == "a" ? "A" : "B", t.stream, t.ops_compared, t.message));
    if (res.truncated.empty() && (res.cut_a || res.cut_b))
      r.not_compared.push_back(
          fmt::format("stream {} has no END record in run {}: the process "
                      "did not end cleanly, so its last ops may be missing",
                      res.summary.name,
                      res.cut_a && res.cut_b ? "A nor B"
                      : res.cut_a            ? "A"
                                             : "B"));
    if ((!res.summary.in_a || !res.summary.in_b) && !res.summary.consumer_last_step)
      r.not_compared.push_back(fmt::format(
          "stream {} is only in run {} ({} ops not compared)", res.summary.name,
          res.summary.in_a ? "A" : "B", res.summary.in_a ? res.summary.ops_a : res.summary.ops_b));
    for (Truncation& t : res.truncated) r.truncated.push_back(std::move(t));
    r.beyond_tolerance = r.beyond_tolerance || res.beyond_tolerance;
    r.ops_compared += res.summary.compared;
    r.records_a += res.records_a;
    r.records_b += res.records_b;
    r.bytes_read += res.bytes;
    r.streams.push_back(std::move(res.summary));
  }
  for (auto& [key, c] : pools) {
    const auto& [pa, pb] = pool_paths[key];
    // A process stopped by a signal, or one of a run that lost a node or rank, has run fewer
    // collectives, not others.
    c.truncated_a = lost_world(r.worlds[0]) || process_stopped_early(run_a, c.process);
    c.truncated_b = lost_world(r.worlds[1]) || process_stopped_early(run_b, c.process);
    c.truncated = c.truncated_a || c.truncated_b;
    if (Status s = compare_pool(pa, pb, &c); !s.ok()) return s;
    r.ops_compared += c.matched;
    r.divergent_ops += std::max(c.unmatched_a, c.unmatched_b);
    if (c.truncated)
      r.not_compared.push_back(fmt::format(
          "a {} thread of {} has no END record in run {}: the process did not end cleanly, so its "
          "last ops may be missing{}",
          c.pool->thread, c.process,
          c.truncated_a && c.truncated_b ? "A nor B"
          : c.truncated_a                ? "A"
                                         : "B",
          c.uncompared_a + c.uncompared_b ? fmt::format(" ({} of the other run's ops not compared)",
                                                        c.uncompared_a + c.uncompared_b)
                                          : ""));
    r.library_pools.push_back(std::move(c));
  }
  note_pools(&r);
  // A part's merge checks the worlds of the whole runs itself.
  if (!options.part)
    for (const WorldCheck& w : r.worlds)
      for (std::string& line : describe_world(w)) r.not_compared.push_back(std::move(line));
  r.endings = collect_endings({run_a, run_b}, tails);
  if (r.first) trace_to_worker(sa, heads, firsts, &*r.first);
  if (r.first) find_shared_writer(sa, heads, &*r.first);
  if (r.first) explain_cause(r.environment, &*r.first);
  r.incomplete = !r.not_compared.empty();
  bool replicas_disagree = false;
  for (int side = 0; side < 2; ++side) {
    if (options.part) {  // the merge checks every part's folds
      r.replica_folds[side] = std::move(replica_folds[side]);
      continue;
    }
    ReplicaCheck c;
    if (Status s = check_replicas_from(side == 0 ? run_a : run_b, std::move(replica_folds[side]),
                                       &c);
        !s.ok())
      return s;
    replicas_disagree = replicas_disagree || c.divergence.has_value();
    r.beyond_tolerance = r.beyond_tolerance || c.divergence.has_value();  // bit for bit
    r.replicas.push_back(std::move(c));
  }
  r.verdict = verdict_of(r, replicas_disagree);
  if (r.verdict == "unexplained")
    r.unexplained = why_no_first(candidates, r.divergent_ops, r.library_pools);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  *report = std::move(r);
  return Status();
}

std::string verdict_of(const DiffReport& r, bool replicas_disagree) {
  if (r.divergent_ops > 0 || r.structural_count > 0 || replicas_disagree)
    // A divergence the report cannot place is no verdict a user can act on: the tool failed.
    return r.first || replicas_disagree ? "divergent" : "unexplained";
  return r.incomplete && !r.gate.allow_truncated ? "incomplete" : "identical";
}

ExitCode gate_exit_code(const DiffReport& report) {
  if (report.verdict == "unexplained") return ExitCode::kUnexplained;
  const bool fails = report.verdict == "divergent" &&
                     !(report.gate.fail_on == "tolerance" && !report.beyond_tolerance);
  if (fails) return ExitCode::kDivergent;
  // Fail closed: what was not compared cannot pass, unless the gate allows it.
  if (report.incomplete && !report.gate.allow_truncated) return ExitCode::kIncomplete;
  return ExitCode::kIdentical;
}

}  // namespace detaudit
