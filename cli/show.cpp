// `detaudit show RUN`: what a run recorded (streams, steps, ops per phase, bytes hashed, the most
// frequent ops, how the program ended), or with --step N the ops of one step.
//
//   detaudit show audit/run-0
//   detaudit show audit/run-0 --step 3 --stream r0.main.t0
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <memory>

#include "cli/verbs.h"
#include "summary/summary.h"
#include "util/units.h"

namespace detaudit::cli {
namespace {

using nlohmann::json;

struct ShowArgs {
  std::string run_dir;
  std::string stream;
  int64_t step = -1;
  bool json = false;
};

std::string shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::string ending(const json& run) {
  if (!run.is_object()) return "no run.json";
  if (!run.value("finished", true)) return "unfinished (detaudit was stopped during the run)";
  if (run.contains("signal") && run["signal"].is_string())
    return "killed by " + run["signal"].get<std::string>();
  if (run.contains("exit_code") && run["exit_code"].is_number())
    return fmt::format("exit code {}", run["exit_code"].get<int>());
  return "unknown";
}

json summary_json(const summary::RunSummary& s) {
  json streams = json::array();
  for (const auto& st : s.streams) {
    json phases = json::object();
    for (int p = 0; p < 4; ++p)
      phases[std::string(trace::phase_name(trace::Phase(p)))] = st.phase_ops[p];
    json j = {{"name", st.name},
              {"rank", st.header.rank},
              {"pid", st.header.pid},
              {"process_role", st.header.process_role},
              {"thread", st.header.thread},
              {"digest", std::string(trace::digest_name(st.header.algo))},
              {"ops", st.ops},
              {"ops_by_phase", phases},
              {"steps", st.step_records},
              {"first_step", st.first_step},
              {"last_step", st.last_step},
              {"bytes", st.bytes},
              {"complete", st.saw_end}};
    if (st.saw_end)
      j["end"] = {{"ops", st.end.ops},
                  {"tensors_hashed", st.end.tensors_hashed},
                  {"bytes_hashed", st.end.bytes_hashed}};
    if (!st.cut_reason.empty()) j["cut_short"] = st.cut_reason;
    streams.push_back(j);
  }
  json top = json::array();
  for (const auto& [name, count] : summary::top_ops(s, 15))
    top.push_back({{"op", name}, {"count", count}});
  json statuses = json::object();
  for (const auto& [p, st] : s.statuses) statuses[p] = st;
  return {{"run", s.dir},       {"run_json", s.run_json}, {"ending", ending(s.run_json)},
          {"streams", streams}, {"top_ops", top},         {"statuses", statuses}};
}

void print_summary(const summary::RunSummary& s) {
  const json& run = s.run_json;
  std::string command;
  if (run.is_object() && run.contains("command") && run["command"].is_array())
    for (const auto& a : run["command"])
      command += (command.empty() ? "" : " ") + a.get<std::string>();
  fmt::print("run {}\n", s.dir);
  if (!command.empty()) fmt::print("  command   {}\n", command);
  fmt::print("  ended     {}", ending(run));
  if (run.is_object() && run.contains("duration_s") && run["duration_s"].is_number())
    fmt::print(" after {:.1f} s", run["duration_s"].get<double>());
  if (run.is_object() && run.contains("start_time") && run["start_time"].is_string())
    fmt::print(", started {}", run["start_time"].get<std::string>());
  fmt::print("\n");
  for (const auto& [process, status] : s.statuses) fmt::print("  {:<9} {}\n", process, status);

  uint64_t ops = 0, tensors = 0, bytes = 0;
  fmt::print("\n{} stream{}\n", s.streams.size(), s.streams.size() == 1 ? "" : "s");
  for (const auto& st : s.streams) {
    ops += st.ops;
    std::string steps = st.step_records == 0
                            ? "no steps"
                            : fmt::format("steps {}-{}", st.first_step, st.last_step);
    fmt::print(
        "  {:<14} pid {:<7} {:<14} {:>9} ops (forward {}, backward {}, optimizer {}, other {})\n",
        st.name, st.header.pid, steps, st.ops, st.phase_ops[0], st.phase_ops[1], st.phase_ops[2],
        st.phase_ops[3]);
    if (st.saw_end) {
      tensors += st.end.tensors_hashed;
      bytes += st.end.bytes_hashed;
      fmt::print("  {:<14} {} tensors hashed, {} ({}), trace {}\n", "", st.end.tensors_hashed,
                 human_bytes(st.end.bytes_hashed), trace::digest_name(st.header.algo),
                 human_bytes(st.bytes));
    } else if (!st.cut_reason.empty()) {
      fmt::print("  {:<14} cut short: {}\n", "", st.cut_reason);
    } else {
      fmt::print("  {:<14} cut short: no END record after {} ops{} (the program was killed?)\n", "",
                 st.ops,
                 st.step_records ? fmt::format(", in step {}", st.last_step) : std::string());
    }
  }
  if (s.streams.empty())
    fmt::print("  (none: the interposer recorded nothing)\n");
  else
    fmt::print("  {:<14} {} ops, {} tensors and {} hashed in complete streams\n", "total", ops,
               tensors, human_bytes(bytes));

  auto top = summary::top_ops(s, 15);
  if (!top.empty()) {
    fmt::print("\nmost frequent ops\n");
    for (const auto& [name, count] : top) fmt::print("  {:>9}  {}\n", count, name);
  }
}

int show_step(const ShowArgs& a) {
  std::vector<std::pair<std::string, std::string>> files;
  if (Status s = summary::find_streams(a.run_dir, a.stream, &files); !s.ok())
    return report_error(s);
  json all = json::array();
  for (const auto& file : files) {
    // Not a structured binding: the lambda below captures the name, which C++17 (clang) forbids.
    const std::string& name = file.first;
    const std::string& path = file.second;
    if (!a.json)
      fmt::print("{} step {}\n  {:>8}  {:<9}  {:<12}  {:<16}  op\n", name, a.step, "order", "phase",
                 "digest", "shape");
    uint64_t n = 0;
    Status s = summary::for_each_step_op(path, uint64_t(a.step), [&](const summary::OpLine& op) {
      ++n;
      if (a.json) {
        all.push_back({{"stream", name},
                       {"order", op.order},
                       {"depth", op.depth},
                       {"op", op.name},
                       {"phase", std::string(trace::phase_name(op.phase))},
                       {"digest", op.digest_prefix},
                       {"shape", op.shape}});
        return;
      }
      fmt::print("  {:>8}  {:<9}  {:<12}  {:<16}  {:{}}{}\n", op.order, trace::phase_name(op.phase),
                 op.digest_prefix.empty() ? "-" : op.digest_prefix,
                 op.digest_prefix.empty() ? "" : shape_text(op.shape), "", op.depth * 2, op.name);
    });
    if (!s.ok()) return report_error(s);
    if (!a.json && n == 0) fmt::print("  (no ops recorded in step {})\n", a.step);
  }
  if (a.json) fmt::print("{}\n", all.dump(2, ' ', false, json::error_handler_t::replace));
  return 0;
}

int show_main(const ShowArgs& a) {
  if (a.step >= 0) return show_step(a);
  summary::RunSummary s;
  if (Status st = summary::summarize_run(a.run_dir, a.stream, &s); !st.ok())
    return report_error(st);
  if (a.json)
    fmt::print("{}\n", summary_json(s).dump(2, ' ', false, json::error_handler_t::replace));
  else
    print_summary(s);
  return 0;
}

}  // namespace

void add_show_verb(CLI::App& app, VerbAction* action) {
  auto args = std::make_shared<ShowArgs>();
  CLI::App* sub = app.add_subcommand("show", "Summarize what a run recorded");
  sub->add_option("run", args->run_dir, "a run directory (audit/run-0)")->required();
  sub->add_option("--step", args->step, "list the ops of this step")->check(CLI::NonNegativeNumber);
  sub->add_option("--stream", args->stream, "only this stream (r0.main.t0)");
  sub->add_flag("--json", args->json, "print JSON instead of text");
  sub->callback([args, action] { *action = [args] { return show_main(*args); }; });
}

}  // namespace detaudit::cli
