#include "diff/replicas.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>

#include "run_layout.h"
#include "trace/reader.h"
#include "trace/run_directory.h"
#include "util/parallel.h"

namespace detaudit {

namespace {

// Op names beyond this many per stream are not kept for finding where the streams part.
constexpr size_t kMaxOpsKept = 4u << 20;

struct Digest {
  trace::DigestBytes bytes{};
  uint8_t len = 0;
  bool operator==(const Digest& o) const {
    return len == o.len && std::memcmp(bytes.data(), o.bytes.data(), len) == 0;
  }
  bool operator!=(const Digest& o) const { return !(*this == o); }
  std::string hex() const {
    std::string s;
    for (size_t i = 0; i < len; ++i) s += fmt::format("{:02x}", bytes[i]);
    return s;
  }
};

Digest digest_of(const trace::TraceReader& r, const std::vector<int64_t>& ids, size_t i) {
  Digest d;
  if (i >= ids.size()) return d;
  const trace::TensorDesc* t = r.tensor(ids[i]);
  if (!t || t->not_read() || t->uninitialized()) return d;
  d.len = t->digest_len;
  d.bytes = t->digest;
  return d;
}

// One in-place write of the optimizer: the parameter (or optimizer state) it leaves.
struct Write {
  std::string op;
  uint64_t index = 0;  // among the stream's ops
  Digest out, param_in, grad_in;
  std::vector<int64_t> sizes;
};

struct OpSeen {
  uint32_t name;  // run-wide id
  uint64_t step;
  trace::Phase phase;
  uint32_t depth;
};

uint64_t fold(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}
uint64_t fold(uint64_t h, const Digest& d) {
  uint64_t words[3] = {};
  std::memcpy(words, d.bytes.data(), std::min(sizeof words, d.bytes.size()));
  return fold(fold(fold(fold(h, d.len), words[0]), words[1]), words[2]);
}
uint64_t fold(uint64_t h, const std::vector<int64_t>& sizes) {
  h = fold(h, sizes.size());
  for (int64_t v : sizes) h = fold(h, uint64_t(v));
  return h;
}

void fold_write(StepFold* f, const Write& w) {
  ++f->count;
  f->outputs = fold(fold(f->outputs, w.out), w.sizes);
  f->parameters = fold(fold(f->parameters, w.param_in), w.sizes);
}

// Read again only for a step where a rank differs from its group (read_rank_stream's `keep`).
struct RankStream : RankFolds {
  std::vector<Write> writes;  // of that step
  std::vector<OpSeen> ops;    // up to its end, for where the ranks part
};

bool is_parameter_write(const trace::OpRecord& op, std::string_view name) {
  return op.phase == trace::Phase::kOptimizer && op.scope == trace::Scope::kFunction &&
         !name.empty() && name.back() == '_' && name != "aten::zero_";
}

std::optional<Write> parameter_write(const trace::TraceReader& r, const trace::OpRecord& op,
                                     std::string_view name, uint64_t index) {
  if (!is_parameter_write(op, name) || op.output_tensors.empty()) return std::nullopt;
  Write w;
  w.op = std::string(name);
  w.index = index;
  w.out = digest_of(r, op.output_tensors, 0);
  w.param_in = digest_of(r, op.input_tensors, 0);
  w.grad_in = digest_of(r, op.input_tensors, 1);
  if (const trace::TensorDesc* t = r.tensor(op.output_tensors[0]))
    w.sizes.assign(t->sizes.begin(), t->sizes.end());
  return w;
}

// Reads a rank's main thread: the fold of each step's writes; with `keep`, that step's writes
// in full and the ops up to its end.
Status read_rank_stream(const std::string& path, std::optional<uint64_t> keep,
                        std::vector<std::string>* names,
                        std::unordered_map<std::string, uint32_t>* ids, RankStream* out) {
  trace::TraceReader r;
  if (Status s = r.open(path); !s.ok()) return s;
  uint64_t index = 0;
  trace::ReadResult res;
  while ((res = r.next()) == trace::ReadResult::kRecord) {
    if (r.kind() != trace::RecordKind::kOp) continue;
    const trace::OpRecord& op = r.op();
    if (keep && op.step > *keep) break;
    std::string_view name = r.string(op.name);
    if (name.substr(0, 15) == "c10d::allreduce") out->all_reduces = true;
    if (keep && out->ops.size() < kMaxOpsKept) {
      auto [it, added] = ids->try_emplace(std::string(name), uint32_t(names->size()));
      if (added) names->emplace_back(name);
      out->ops.push_back({it->second, op.step, op.phase, op.depth});
    }
    if (std::optional<Write> w = parameter_write(r, op, name, index)) {
      fold_write(&out->folds[op.step], *w);
      if (keep && op.step == *keep) out->writes.push_back(std::move(*w));
    }
    ++index;
  }
  if (res == trace::ReadResult::kCorrupt) return Status::error(r.error(), ExitCode::kBadInput);
  return Status();  // a stream cut short is checked up to its cut
}

// The first op where two ranks' streams part, up to their ops `end_a` and `end_b`: an op one ran
// and the other did not. Names, phases and steps only: their data differ by design.
std::string parted_at(const RankStream& a, size_t end_a, const RankStream& b, size_t end_b,
                      const std::vector<std::string>& names) {
  end_a = std::min(end_a, a.ops.size());
  end_b = std::min(end_b, b.ops.size());
  size_t i = 0, j = 0;
  auto same = [&](size_t x, size_t y) {
    return x < end_a && y < end_b && a.ops[x].name == b.ops[y].name &&
           a.ops[x].phase == b.ops[y].phase;
  };
  while (i < end_a && j < end_b && same(i, j)) ++i, ++j;
  if (i >= end_a && j >= end_b) return "";
  // The side with an extra op is the one whose next op realigns the two.
  const bool extra_in_b = j < end_b && (i >= end_a || same(i, j + 1) || !same(i + 1, j));
  const RankStream& s = extra_in_b ? b : a;
  size_t at = extra_in_b ? j : i;
  // Nested ops are written before the op around them: name the outermost one.
  for (size_t k = at; k < s.ops.size() && k < at + 256; ++k)
    if (s.ops[k].depth == 0) {
      at = k;
      break;
    }
  const OpSeen& op = s.ops[at];
  const RankStream& other = extra_in_b ? a : b;
  return fmt::format("{} op #{} {}, step {}, {} phase, which rank {} did not run", s.name, at,
                     names[op.name], op.step, trace::phase_name(op.phase), other.rank);
}

// Rank `s` parts from its replica `ref` at the k-th parameter write of `step`.
ReplicaDivergence divergence_at(uint64_t step, size_t k, const RankStream& ref, const RankStream& s,
                                const std::vector<std::string>& names) {
  const std::vector<Write>& wr = ref.writes;
  const std::vector<Write>& ws = s.writes;
  const bool missing = k >= ws.size();
  ReplicaDivergence d;
  d.step = step;
  d.position = k;
  d.op = wr[k].op;
  d.rank = s.rank;
  d.reference_rank = ref.rank;
  d.stream = s.name;
  d.reference_stream = ref.name;
  d.reference_digest = wr[k].out.hex();
  d.sizes = wr[k].sizes;
  if (!missing) {
    d.digest = ws[k].out.hex();
    d.input_differs = ws[k].param_in != wr[k].param_in ? "parameter"
                      : ws[k].grad_in != wr[k].grad_in ? "gradient"
                                                       : "";
  }
  d.parted_at = parted_at(ref, wr[k].index + 1, s, missing ? SIZE_MAX : ws[k].index + 1, names);
  const std::string what =
      d.input_differs == "parameter"
          ? "it read a different parameter: one rank changed it after the last update"
      : d.input_differs == "gradient"
          ? "it read a different gradient: the ranks did not all-reduce the same gradients"
      : missing ? "rank " + std::to_string(s.rank) + " made fewer parameter writes"
                : "same parameter and gradient in: the update itself differs";
  d.detail = fmt::format("rank {}'s parameter #{} of step {} ({} [{}]) differs from rank {}'s; {}",
                         s.rank, k, step, d.op, fmt::join(d.sizes, ", "), ref.rank, what);
  return d;
}

}  // namespace

void ReplicaFolder::op(const trace::TraceReader& r, const trace::OpRecord& op) {
  std::string_view name = r.string(op.name);
  if (name.substr(0, 15) == "c10d::allreduce") out_->all_reduces = true;
  if (std::optional<Write> w = parameter_write(r, op, name, index_))
    fold_write(&out_->folds[op.step], *w);
  ++index_;
}

Status read_replica_folds(const trace::RunDirectory& run, const RangeSet& selected,
                          unsigned threads, std::vector<RankFolds>* out) {
  out->clear();
  std::map<int64_t, trace::RunFile> mains;  // rank -> the main thread's stream of its main process
  for (const trace::RunFile& f : run.traces()) {
    trace::TraceReader r;
    if (!r.open(f.path).ok()) continue;  // the diff reports what is wrong with it
    if (r.header().process_role == "main" && r.header().thread == "main" && r.header().rank >= 0 &&
        selected.contains(uint64_t(r.header().rank)))
      mains.emplace(r.header().rank, f);
  }
  std::vector<RankStream> read(mains.size());
  {
    size_t i = 0;
    for (const auto& [rank, stream] : mains) {
      read[i].rank = rank;
      read[i].path = stream.path;
      read[i++].name = stream.name;
    }
  }
  if (Status st = for_each_parallel(read.size(), threads,
                                    [&](size_t i) {
                                      std::vector<std::string> no_names;
                                      std::unordered_map<std::string, uint32_t> no_ids;
                                      return read_rank_stream(read[i].path, std::nullopt, &no_names,
                                                              &no_ids, &read[i]);
                                    });
      !st.ok())
    return st;
  for (RankStream& s : read) out->push_back(std::move(static_cast<RankFolds&>(s)));
  return Status();
}

Status check_replicas(const trace::RunDirectory& run, ReplicaCheck* out, unsigned threads) {
  std::vector<RankFolds> folds;
  if (Status s = read_replica_folds(run, RangeSet(), threads, &folds); !s.ok()) return s;
  return check_replicas_from(run, std::move(folds), out);
}

namespace {

// Replica groups: ranks whose first common step writes the same parameters, in shape and in
// the bytes read. DDP's ranks make one group; HSDP's make one per shard, and shards of one
// parameter, which differ by design, are never compared with each other. Indices into `ranks`,
// the lowest rank first; groups of one rank are left out.
std::vector<std::vector<size_t>> replica_groups(const std::vector<RankStream>& ranks,
                                                uint64_t first_step) {
  auto same_parameters = [&](const RankStream& a, const RankStream& b) {
    return a.folds.at(first_step).same_parameters(b.folds.at(first_step));
  };
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < ranks.size(); ++i) {
    auto g = std::find_if(groups.begin(), groups.end(), [&](const std::vector<size_t>& g) {
      return same_parameters(ranks[g[0]], ranks[i]);
    });
    if (g == groups.end())
      groups.push_back({i});
    else
      g->push_back(i);
  }
  groups.erase(std::remove_if(groups.begin(), groups.end(),
                              [](const std::vector<size_t>& g) { return g.size() < 2; }),
               groups.end());
  return groups;
}

}  // namespace

// The steps every rank recorded, in order.
static std::vector<uint64_t> steps_of_every_rank(const std::vector<RankStream>& ranks) {
  std::vector<uint64_t> steps;
  for (const auto& [step, f] : ranks[0].folds) {
    bool everywhere = true;
    for (const RankStream& s : ranks) everywhere = everywhere && s.folds.count(step);
    if (everywhere) steps.push_back(step);
  }
  return steps;
}

// In a step where `differing` ranks of each group wrote otherwise than its reference (the group's
// first), their writes and the reference's read again: the first parameter that differs, by
// position, then group, then rank, into out->divergence.
static Status find_differing_write(uint64_t step, const std::vector<std::vector<size_t>>& groups,
                                   const std::vector<std::vector<size_t>>& differing,
                                   std::vector<RankStream>* ranks, std::vector<std::string>* names,
                                   std::unordered_map<std::string, uint32_t>* ids,
                                   ReplicaCheck* out) {
  for (size_t g = 0; g < groups.size(); ++g) {
    if (differing[g].empty()) continue;
    std::vector<size_t> again = differing[g];
    again.push_back(groups[g][0]);
    for (size_t i : again) {
      RankStream& s = (*ranks)[i];
      RankStream fresh;
      fresh.rank = s.rank;
      fresh.name = s.name;
      fresh.path = s.path;
      if (Status st = read_rank_stream(s.path, step, names, ids, &fresh); !st.ok()) return st;
      s.writes = std::move(fresh.writes);
      s.ops = std::move(fresh.ops);
    }
  }
  for (size_t k = 0;; ++k) {
    bool more = false;
    for (size_t g = 0; g < groups.size(); ++g) {
      if (differing[g].empty()) continue;
      const RankStream& ref = (*ranks)[groups[g][0]];
      const std::vector<Write>& wr = ref.writes;
      if (k >= wr.size()) continue;
      more = true;
      for (size_t i : differing[g]) {
        const std::vector<Write>& ws = (*ranks)[i].writes;
        const bool missing = k >= ws.size();
        if (!missing && ws[k].out == wr[k].out && ws[k].sizes == wr[k].sizes) continue;
        out->divergence = divergence_at(step, k, ref, (*ranks)[i], *names);
        return Status();
      }
    }
    if (!more) break;
  }
  return Status();
}

Status check_replicas_from(const trace::RunDirectory& run, std::vector<RankFolds> folds,
                           ReplicaCheck* out) {
  *out = ReplicaCheck{};
  out->run_dir = run.path();
  if (folds.size() < 2) return Status();  // one rank: nothing to compare, nothing to read
  std::sort(folds.begin(), folds.end(),
            [](const RankFolds& a, const RankFolds& b) { return a.rank < b.rank; });
  std::vector<RankStream> read(folds.size());
  for (size_t i = 0; i < folds.size(); ++i) static_cast<RankFolds&>(read[i]) = std::move(folds[i]);
  std::vector<RankStream> ranks;
  for (RankStream& s : read) {
    if (s.folds.empty()) continue;  // no optimizer on this rank's main thread
    out->ranks.push_back(s.rank);
    ranks.push_back(std::move(s));
  }
  if (ranks.size() < 2) return Status();

  const std::vector<uint64_t> steps = steps_of_every_rank(ranks);
  if (steps.empty()) {
    out->not_checked = "the ranks recorded no optimizer step in common";
    return Status();
  }
  for (const RankStream& s : ranks)
    if (!s.all_reduces) {
      // Ranks that train on their own (seeded alike, say) are not replicas of each other.
      out->not_checked = fmt::format("rank {} ran no all-reduce: not data-parallel replicas",
                                     s.rank);
      return Status();
    }
  const std::vector<std::vector<size_t>> groups = replica_groups(ranks, steps[0]);
  if (groups.empty()) {
    out->not_checked = ranks.size() == 2
                           ? fmt::format(
                                 "ranks {} and {} update different parameters in step {}: not "
                                 "data-parallel replicas",
                                 ranks[0].rank, ranks[1].rank, steps[0])
                           : fmt::format(
                                 "no two of ranks {} update the same parameters in step {}: not "
                                 "data-parallel replicas",
                                 fmt::join(out->ranks, ", "), steps[0]);
    return Status();
  }
  out->replicas = true;
  out->parameters = ranks[groups[0][0]].folds.at(steps[0]).count;
  for (const std::vector<size_t>& g : groups) {
    std::vector<int64_t> members;
    for (size_t i : g) members.push_back(ranks[i].rank);
    out->groups.push_back(std::move(members));
  }

  std::vector<std::string> names;
  std::unordered_map<std::string, uint32_t> ids;
  for (uint64_t step : steps) {
    ++out->steps_checked;
    // Ranks whose writes in this step are not their group's reference's, write for write.
    std::vector<std::vector<size_t>> differing(groups.size());
    bool any = false;
    for (size_t g = 0; g < groups.size(); ++g)
      for (size_t i : groups[g])
        if (i != groups[g][0] &&
            !ranks[i].folds.at(step).same_outputs(ranks[groups[g][0]].folds.at(step))) {
          differing[g].push_back(i);
          any = true;
        }
    if (!any) continue;
    if (Status st = find_differing_write(step, groups, differing, &ranks, &names, &ids, out);
        !st.ok() || out->divergence)
      return st;
    // Only more writes than the reference's, which the check does not count: read no further.
    for (RankStream& s : ranks) {
      s.writes.clear();
      s.ops.clear();
    }
  }
  return Status();
}

nlohmann::json replica_check_to_json(const ReplicaCheck& c) {
  nlohmann::json j = {{"run", c.run_dir},
                      {"ranks", c.ranks},
                      {"replicas", c.replicas},
                      {"groups", c.groups},
                      {"not_checked", c.not_checked.empty() ? nlohmann::json(nullptr)
                                                            : nlohmann::json(c.not_checked)},
                      {"steps_checked", c.steps_checked},
                      {"parameters", c.parameters},
                      {"divergence", nullptr}};
  if (c.divergence) {
    const ReplicaDivergence& d = *c.divergence;
    j["divergence"] = {
        {"class", "replica-divergence"},
        {"step", d.step},
        {"position", d.position},
        {"op", d.op},
        {"rank", d.rank},
        {"reference_rank", d.reference_rank},
        {"stream", d.stream},
        {"reference_stream", d.reference_stream},
        {"digest", d.digest},
        {"reference_digest", d.reference_digest},
        {"sizes", d.sizes},
        {"input_differs",
         d.input_differs.empty() ? nlohmann::json(nullptr) : nlohmann::json(d.input_differs)},
        {"parted_at", d.parted_at.empty() ? nlohmann::json(nullptr) : nlohmann::json(d.parted_at)},
        {"detail", d.detail}};
  }
  return j;
}

std::string render_replica_check(const ReplicaCheck& c) {
  if (c.ranks.size() < 2) return "";
  if (!c.replicas) return fmt::format("Replicas ({}): not checked: {}\n", c.run_dir, c.not_checked);
  if (!c.divergence) {
    if (c.groups.size() == 1 && c.groups[0] == c.ranks)
      return fmt::format(
          "Replicas ({}): ranks {} hold the same {} parameters after each of {} "
          "steps\n",
          c.run_dir, fmt::join(c.ranks, ", "), c.parameters, c.steps_checked);
    std::vector<std::string> groups;
    for (const std::vector<int64_t>& g : c.groups)
      groups.push_back(fmt::format("{{{}}}", fmt::join(g, ", ")));
    return fmt::format(
        "Replicas ({}): each of the replica groups {} holds the same parameters "
        "after each of {} steps (shards of a parameter are not compared)\n",
        c.run_dir, fmt::join(groups, " "), c.steps_checked);
  }
  const ReplicaDivergence& d = *c.divergence;
  std::string out = fmt::format("Replicas ({}): DISAGREE (replica-divergence) at step {}\n",
                                c.run_dir, d.step);
  out += fmt::format("  {}\n", d.detail);
  if (!d.parted_at.empty()) out += fmt::format("  the ranks' streams part at {}\n", d.parted_at);
  out +=
      "  remedy: change parameters on every rank alike (or through a collective); with DDP, "
      "let it all-reduce every gradient (no no_sync on one rank only)\n";
  return out;
}

}  // namespace detaudit
