#include "diff/step_states.h"

#include <map>
#include <vector>

#include "run_layout.h"
#include "trace/reader.h"
#include "trace/run_directory.h"

namespace detaudit {

namespace {

// Main-thread streams of a run's main processes, by file name.
std::map<std::string, std::string> main_streams(const std::string& run_dir) {
  std::map<std::string, std::string> out;
  for (const trace::RunFile& f : trace::RunDirectory::list(run_dir).traces()) {
    trace::TraceReader r;
    if (!r.open(f.path).ok()) continue;  // the diff says what is wrong with it
    if (r.header().process_role == "main" && r.header().thread == "main")
      out.emplace(f.name, f.path);
  }
  return out;
}

}  // namespace

Status read_steps(const std::string& path, std::vector<trace::StepInfo>* steps) {
  trace::TraceReader r;
  if (Status s = r.open(path); !s.ok()) return s;
  trace::ReadResult res;
  while ((res = r.next()) == trace::ReadResult::kRecord) {
  }
  if (res == trace::ReadResult::kCorrupt) return Status::error(r.error(), ExitCode::kBadInput);
  *steps = r.steps();
  return Status();
}

Status first_generator_difference(const std::string& run_a, const std::string& run_b,
                                  std::optional<GeneratorDifference>* out) {
  out->reset();
  const auto streams_b = main_streams(run_b);
  for (const auto& [name, path_a] : main_streams(run_a)) {
    auto b = streams_b.find(name);
    if (b == streams_b.end()) continue;
    std::vector<trace::StepInfo> sa, sb;
    if (Status s = read_steps(path_a, &sa); !s.ok()) return s;
    if (Status s = read_steps(b->second, &sb); !s.ok()) return s;
    std::map<uint64_t, const trace::StepInfo*> by_step;
    for (const trace::StepInfo& s : sb) by_step.emplace(s.step, &s);
    for (const trace::StepInfo& s : sa) {
      // The stream's first STEP record is taken at the process's first op, as a rule before the
      // program seeds: an unseeded state, different in every run.
      if (&s == &sa.front()) continue;
      auto it = by_step.find(s.step);
      if (it == by_step.end() || (*out && (*out)->step <= s.step)) continue;
      const trace::StepInfo& t = *it->second;
      if (s.rng_cpu == t.rng_cpu && s.rng_cuda == t.rng_cuda) continue;
      const bool cpu = s.rng_cpu != t.rng_cpu;
      *out = GeneratorDifference{name, s.step, cpu ? "cpu" : "cuda", cpu ? s.rng_cpu : s.rng_cuda,
                                 cpu ? t.rng_cpu : t.rng_cuda};
    }
  }
  return Status();
}

}  // namespace detaudit
