#include "diff/stream_selection.h"

#include <cctype>
#include <functional>
#include <string_view>

#include "run_layout.h"
#include "trace/reader.h"

namespace detaudit {

namespace {

Status list_streams(const trace::RunDirectory& run, std::map<std::string, std::string>* out) {
  if (Status s = run.require_traces(); !s.ok()) return s;
  for (const trace::RunFile& stream : run.traces()) (*out)[stream.name] = stream.path;
  return Status();
}

StreamHead read_head(const std::string& path) {
  StreamHead h;
  trace::TraceReader r;
  if (!r.open(path).ok()) return h;  // compare_stream reports what is wrong with it
  h.process = layout::process_name(r.header().rank, r.header().process_role);
  h.dataloader_worker = (r.header().flags & trace::kStreamDataLoaderWorker) != 0;
  return h;
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
std::map<PoolKey, PoolComparison> take_pools(
    std::map<std::string, std::string>* sa, std::map<std::string, std::string>* sb,
    std::map<PoolKey, std::pair<std::vector<std::string>, std::vector<std::string>>>* paths) {
  std::map<PoolKey, PoolComparison> pools;
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

}  // namespace

// "r0.main" for a worker "r0.main.0": the process that forked it.
std::string parent_process(const std::string& process) {
  size_t dot = process.rfind('.');
  return dot == std::string::npos ? process : process.substr(0, dot);
}

Status select_streams(const trace::RunDirectory& run_a, const trace::RunDirectory& run_b,
                      const RangeSet& ranks, StreamSelection* out) {
  std::map<std::string, std::string>& sa = out->streams[0];
  std::map<std::string, std::string>& sb = out->streams[1];
  if (Status s = list_streams(run_a, &sa); !s.ok()) return s;
  if (Status s = list_streams(run_b, &sb); !s.ok()) return s;
  if (!ranks.all())
    for (auto* streams : {&sa, &sb})
      for (auto it = streams->begin(); it != streams->end();)
        it = ranks.contains(uint64_t(trace::rank_of_name(it->first).value_or(-1)))
                 ? std::next(it)
                 : streams->erase(it);
  out->pools = take_pools(&sa, &sb, &out->pool_paths);
  pair_clashing_streams(sa, &sb);
  for (const auto* streams : {&sa, &sb})
    for (const auto& [name, path] : *streams)
      if (!out->heads.count(name)) out->heads[name] = read_head(path);
  return Status();
}

}  // namespace detaudit
