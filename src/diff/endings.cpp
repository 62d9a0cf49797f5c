#include "diff/endings.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "diff/world.h"
#include "trace/process_status.h"
#include "trace/run_directory.h"

namespace detaudit {
namespace fs = std::filesystem;

namespace {

// How one launch ended, from its manifest: "exit code 1", "killed by SIGABRT", "never finished";
// "" when there is none or it says nothing.
std::string launch_ending(const std::string& manifest, bool* failed) {
  std::ifstream in(manifest);
  if (!in) return "";
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return "";
  if (!j.value("finished", false)) {
    // A whole run's unfinished run.json: its supervisor was killed; said by the streams.
    if (!j.contains("node")) return "";
    *failed = true;
    return "never finished";
  }
  *failed = *failed || !j.value("succeeded", true);
  if (j.contains("signal") && j["signal"].is_string())
    return "killed by " + j["signal"].get<std::string>();
  if (j.contains("exit_code") && j["exit_code"].is_number_integer())
    return fmt::format("exit code {}", j["exit_code"].get<int>());
  return "";
}

// How the program itself ended, from run.json, or from each node's manifest in a run recorded
// across nodes ("node n0: exit code 1; node n1: never finished"); "" when the run directory has
// neither (a copy of its streams).
std::string program_ending(const trace::RunDirectory& run, bool* failed) {
  *failed = false;
  if (fs::exists(run.run_manifest())) return launch_ending(run.run_manifest(), failed);
  std::vector<std::string> nodes;
  for (const trace::RunFile& manifest : run.node_manifests()) {
    bool failed_here = false;
    std::string how = launch_ending(manifest.path, &failed_here);
    *failed = *failed || failed_here;
    if (!how.empty()) nodes.push_back("node " + manifest.name + ": " + how);
  }
  std::sort(nodes.begin(), nodes.end());
  std::string out;
  for (const std::string& n : nodes) out += (out.empty() ? "" : "; ") + n;
  return out;
}

}  // namespace

bool process_stopped_early(const trace::RunDirectory& run, const std::string& process) {
  trace::ProcessStatus status;
  const trace::RunFile* file = run.status(process);
  if (!file || !trace::read_process_status(file->path, &status))
    return false;  // no .status: a copy of the streams, or a detaudit before it
  return !status.ending || (!status.ending->clean() && !status.ending->exiting);
}

std::string describe_ending(const ProcessEndingReport& p) {
  std::string out = p.process + " ";
  if (!p.recorded_ending) {
    out += "ended without a word (SIGKILL, the OOM killer, or a lost node)";
  } else {
    out += p.ended;
    out += p.thread.empty() ? " on a thread that recorded nothing" : " on thread " + p.thread;
    out += p.inside_op.empty() ? " after its last recorded op"
                               : fmt::format(" inside {} (step {}), which never finished",
                                             p.inside_op, p.inside_step);
  }
  if (p.any_op)
    out += fmt::format(" ({}: step {}, {}, op #{} of {})",
                       p.recorded_ending ? "last op" : "its last recorded op", p.last_step,
                       p.last_op, p.last_index, p.last_stream);
  if (p.exiting) out += ", while exiting";
  out += p.streams_whole ? "; its streams are whole" : "; its streams are cut short";
  return out;
}

std::vector<RunEnding> collect_endings(const std::vector<const trace::RunDirectory*>& runs,
                                       const std::vector<std::vector<StreamTail>>& tails) {
  std::vector<RunEnding> out;
  for (size_t i = 0; i < runs.size(); ++i) {
    RunEnding run;
    run.run = i == 0 ? "A" : "B";
    run.program = program_ending(*runs[i], &run.failed);
    // The streams of each process: whether all are whole, and which op ended last.
    std::map<std::string, ProcessEndingReport> by_process;
    std::map<std::string, uint64_t> last_order;
    for (const StreamTail& t : i < tails.size() ? tails[i] : std::vector<StreamTail>{}) {
      ProcessEndingReport& p = by_process[t.process];
      p.process = t.process;
      p.rank = t.rank;
      p.streams_whole = p.streams_whole && t.ended;
      if (!t.any_op || (p.any_op && t.last_order <= last_order[t.process])) continue;
      p.any_op = true;
      p.last_stream = t.stream;
      p.last_op = t.last_op;
      p.last_step = t.last_step;
      p.last_index = t.last_index;
      last_order[t.process] = t.last_order;
    }
    for (const trace::RunFile& f : runs[i]->statuses()) {
      trace::ProcessStatus status;
      if (!trace::read_process_status(f.path, &status)) continue;
      const std::string& process = f.name;
      auto it = by_process.find(process);
      ProcessEndingReport p = it != by_process.end() ? it->second : ProcessEndingReport{};
      p.process = process;
      if (it == by_process.end())
        if (auto rank = trace::rank_of_name(process)) p.rank = *rank;
      if (status.ending) {
        const trace::ProcessEnding& end = *status.ending;
        if (end.clean()) continue;
        p.recorded_ending = true;
        p.ended = end.how_text();
        p.thread = end.thread;
        p.inside_op = end.inside_op;
        p.inside_step = end.inside_step;
        p.exiting = end.exiting;
      } else {
        // A detaudit before 0.3 wrote no ending: say nothing unless something else went wrong.
        if (!run.failed && p.streams_whole) continue;
        if (it == by_process.end()) continue;  // recorded nothing: nothing was lost
        p.ended = "no end recorded";
      }
      p.detail = describe_ending(p);
      run.processes.push_back(std::move(p));
    }
    std::sort(run.processes.begin(), run.processes.end(),
              [](const ProcessEndingReport& x, const ProcessEndingReport& y) {
                return x.process < y.process;
              });
    if (run.failed || !run.processes.empty()) out.push_back(std::move(run));
  }
  return out;
}

}  // namespace detaudit
