#include "summary/timeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

#include "run_layout.h"
#include "summary/summary.h"
#include "trace/reader.h"

namespace detaudit::summary {
namespace {

using nlohmann::json;

// A leaf lasts half an order step; a parent ends just after its last nested op. Nesting up to
// 40 deep stays inside one order step, so siblings never overlap.
constexpr double kLeaf = 0.5, kParentTail = 0.01;

// Names come from the trace and need not be UTF-8 (a thread's, an op's): replace what is not,
// rather than throw.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void write_event(std::ostream& out, bool* first, const json& e) {
  out << (*first ? "\n" : ",\n") << dump(e);
  *first = false;
}

}  // namespace

Status write_timeline(const std::string& run_dir, const TimelineMarks* marks, std::ostream& out) {
  std::vector<std::pair<std::string, std::string>> streams;
  if (Status s = find_streams(run_dir, "", &streams); !s.ok()) return s;
  out << "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"generator\":\"detaudit\",\"run\":"
      << dump(run_dir) << ",\"time\":\"program order: op k starts at k us\"},"
      << "\"traceEvents\":[";
  bool first_event = true;
  std::map<uint64_t, int> tids_per_pid;
  std::set<uint64_t> named_pids;
  for (const auto& [name, path] : streams) {
    trace::TraceReader r;
    if (Status s = r.open(path); !s.ok()) return s;
    const trace::StreamHeader& h = r.header();
    const uint64_t pid = h.pid;
    const int tid = ++tids_per_pid[pid];
    const std::string process = layout::process_name(h.rank, h.process_role);
    if (named_pids.insert(pid).second) {
      write_event(out, &first_event,
                  {{"ph", "M"},
                   {"name", "process_name"},
                   {"pid", pid},
                   {"tid", 0},
                   {"args", {{"name", process}}}});
      // By rank, then by first appearance. A corrupt header can carry any rank: clamped, the
      // product cannot overflow.
      const int64_t rank = std::clamp<int64_t>(h.rank, -(int64_t(1) << 40), int64_t(1) << 40);
      write_event(out, &first_event,
                  {{"ph", "M"},
                   {"name", "process_sort_index"},
                   {"pid", pid},
                   {"tid", 0},
                   {"args", {{"sort_index", rank * 1000 + int64_t(named_pids.size())}}}});
    }
    write_event(out, &first_event,
                {{"ph", "M"},
                 {"name", "thread_name"},
                 {"pid", pid},
                 {"tid", tid},
                 {"args", {{"name", "t-" + h.thread}}}});
    const std::set<uint64_t>* divergent = nullptr;
    if (marks)
      if (auto it = marks->divergent.find(name); it != marks->divergent.end())
        divergent = &it->second;

    std::vector<std::pair<uint32_t, double>> open;  // (depth, end) of ops not yet in a parent
    uint64_t last_step = UINT64_MAX;
    trace::ReadResult res;
    while ((res = r.next()) == trace::ReadResult::kRecord) {
      if (r.kind() != trace::RecordKind::kOp) continue;
      const trace::OpRecord& op = r.op();
      const double start = double(op.order);
      double end = start + kLeaf;
      // Written when they end, nested ops come just before the op that holds them.
      while (!open.empty() && open.back().first > op.depth) {
        end = std::max(end, open.back().second + kParentTail);
        open.pop_back();
      }
      open.emplace_back(op.depth, end);
      if (op.step != last_step) {
        last_step = op.step;
        write_event(out, &first_event,
                    {{"ph", "i"},
                     {"s", "t"},
                     {"name", fmt::format("step {}", op.step)},
                     {"ts", start},
                     {"pid", pid},
                     {"tid", tid}});
      }
      json e = {{"ph", "X"},
                {"name", std::string(r.string(op.name))},
                {"cat", std::string(trace::phase_name(op.phase))},
                {"ts", start},
                {"dur", end - start},
                {"pid", pid},
                {"tid", tid},
                {"args", {{"step", op.step}, {"order", op.order}, {"depth", op.depth}}}};
      if (op.scope_path != UINT32_MAX && !r.string(op.scope_path).empty())
        e["args"]["scope"] = std::string(r.string(op.scope_path));
      if (divergent && divergent->count(op.order)) {
        e["args"]["divergent"] = true;
        e["cname"] = "terrible";
      }
      write_event(out, &first_event, e);
      if (marks && marks->first && marks->first->first == name && marks->first->second == op.order)
        write_event(out, &first_event,
                    {{"ph", "i"},
                     {"s", "p"},
                     {"name", "first divergence: " + marks->first_label},
                     {"ts", start},
                     {"pid", pid},
                     {"tid", tid},
                     {"args", {{"op", std::string(r.string(op.name))}, {"step", op.step}}}});
    }
    if (res == trace::ReadResult::kCorrupt) return Status::error(r.error(), ExitCode::kBadInput);
  }
  out << "\n]}\n";
  return Status();
}

}  // namespace detaudit::summary
