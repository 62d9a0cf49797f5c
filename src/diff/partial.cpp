#include "diff/partial.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>

#include "diff/classify.h"
#include "diff/comparator.h"
#include "diff/endings.h"
#include "diff/environment.h"
#include "diff/first_divergence.h"
#include "diff/phases.h"
#include "diff/replicas.h"
#include "diff/report_model.h"
#include "diff/resume.h"
#include "diff/stream_selection.h"
#include "diff/world.h"
#include "trace/run_directory.h"

namespace detaudit {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json collectives_json(const std::map<uint64_t, uint64_t>& joined) {
  json out = json::array();
  for (const auto& [group, seq] : joined) out.push_back({group, seq});
  return out;
}

std::map<uint64_t, uint64_t> collectives_from(const json& j) {
  std::map<uint64_t, uint64_t> out;
  for (const json& e : j) out[e.at(0).get<uint64_t>()] = e.at(1).get<uint64_t>();
  return out;
}

// What the merge needs of a stream's own first divergence to order it among the others'.
json candidate_json(const FirstDivergence& f) {
  return {{"stream", f.stream},
          {"process", f.process},
          {"rank", f.rank},
          {"step", f.step},
          {"order_a", f.order_a},
          {"class", divergence_class_name(f.divergence_class)},
          {"received_through", f.evidence.received_through},
          {"before", collectives_json(f.collectives_before)},
          {"after", collectives_json(f.collectives_after)}};
}

FirstDivergence candidate_from(const json& j) {
  FirstDivergence f;
  f.stream = j.at("stream").get<std::string>();
  f.process = j.at("process").get<std::string>();
  f.rank = j.at("rank").get<int64_t>();
  f.step = j.at("step").get<uint64_t>();
  f.order_a = j.at("order_a").get<uint64_t>();
  if (!parse_divergence_class(j.at("class").get<std::string>(), &f.divergence_class))
    throw std::invalid_argument("unknown divergence class " + j.at("class").dump());
  f.evidence.received_through = j.at("received_through").get<std::string>();
  f.collectives_before = collectives_from(j.at("before"));
  f.collectives_after = collectives_from(j.at("after"));
  return f;
}

json folds_json(const std::vector<RankFolds>& ranks) {
  json out = json::array();
  for (const RankFolds& r : ranks) {
    json steps = json::array();
    for (const auto& [step, f] : r.folds) steps.push_back({step, f.count, f.outputs, f.parameters});
    out.push_back({{"rank", r.rank},
                   {"name", r.name},
                   {"path", r.path},
                   {"all_reduces", r.all_reduces},
                   {"steps", steps}});
  }
  return out;
}

void folds_from(const json& j, std::vector<RankFolds>* out) {
  for (const json& e : j) {
    RankFolds r;
    r.rank = e.at("rank").get<int64_t>();
    r.name = e.at("name").get<std::string>();
    r.path = e.at("path").get<std::string>();
    r.all_reduces = e.at("all_reduces").get<bool>();
    for (const json& s : e.at("steps")) {
      StepFold& f = r.folds[s.at(0).get<uint64_t>()];
      f.count = s.at(1).get<uint32_t>();
      f.outputs = s.at(2).get<uint64_t>();
      f.parameters = s.at(3).get<uint64_t>();
    }
    out->push_back(std::move(r));
  }
}

// A resumed process a part found among its ranks; the merge says whether it was verified and
// what was missed.
json resume_json(const ResumedProcess& rp) {
  return {{"run", rp.run},
          {"process", rp.process},
          {"continues", rp.continues},
          {"step", rp.step},
          {"found_by", rp.found_by},
          {"setup_ops", rp.setup_ops},
          {"reordered_ops", rp.reordered_ops},
          {"workers", rp.workers}};
}

json numerics_json(const std::optional<NumericsChange>& n) {
  if (!n) return nullptr;
  json growth = json::array();
  for (const GrowthPoint& g : n->growth) growth.push_back({g.index, g.op, g.phase, g.relative});
  return {{"stream", n->stream},
          {"growth", growth},
          {"rank", n->rank},
          {"step", n->step},
          {"index", n->index},
          {"phase", n->phase},
          {"op", n->op},
          {"replaced_by", n->replaced_by},
          {"tensor", n->tensor},
          {"dtype", n->dtype},
          {"output_relative", n->output_relative},
          {"output_ulps", n->output_ulps},
          {"input", n->input},
          {"input_relative", n->input_relative},
          {"input_ulps", n->input_ulps}};
}

NumericsChange numerics_from(const json& j) {
  NumericsChange c;
  c.stream = j.at("stream").get<std::string>();
  c.rank = j.at("rank").get<int64_t>();
  c.step = j.at("step").get<uint64_t>();
  c.index = j.at("index").get<uint64_t>();
  c.phase = j.at("phase").get<std::string>();
  c.op = j.at("op").get<std::string>();
  c.replaced_by = j.value("replaced_by", "");
  c.tensor = j.at("tensor").get<std::string>();
  c.dtype = j.at("dtype").get<std::string>();
  c.output_relative = j.at("output_relative").get<double>();
  c.output_ulps = j.at("output_ulps").get<double>();
  c.input = j.at("input").get<std::string>();
  c.input_relative = j.at("input_relative").get<double>();
  c.input_ulps = j.at("input_ulps").get<double>();
  for (const json& g : j.value("growth", json::array()))
    c.growth.push_back({g.at(0).get<uint64_t>(), g.at(1).get<std::string>(),
                        g.at(2).get<std::string>(), g.at(3).get<double>()});
  return c;
}

ResumedProcess resume_from(const json& j) {
  ResumedProcess rp;
  rp.run = j.at("run").get<int>();
  rp.process = j.at("process").get<std::string>();
  rp.continues = j.at("continues").get<std::string>();
  rp.step = j.at("step").get<uint64_t>();
  rp.found_by = j.at("found_by").get<std::string>();
  rp.setup_ops = j.at("setup_ops").get<uint64_t>();
  rp.reordered_ops = j.at("reordered_ops").get<uint64_t>();
  rp.workers = j.at("workers").get<std::vector<std::string>>();
  return rp;
}

Status bad_part(const std::string& source, const std::string& what) {
  return Status::error(
      fmt::format("{}: {}; write it again with detaudit diff RUN_A RUN_B --ranks R --part FILE",
                  source, what),
      ExitCode::kBadInput);
}

}  // namespace

Status diff_part(const std::string& run_a, const std::string& run_b, const DiffOptions& options,
                 json* part) {
  DiffOptions o = options;
  o.part = true;
  DiffReport r;
  if (Status s = diff_runs(run_a, run_b, o, &r); !s.ok()) return s;
  json candidates = json::array();
  for (const FirstDivergence& f : r.candidates) candidates.push_back(candidate_json(f));
  json streams = json::array(), per_step = json::array(), curve = json::array();
  for (const StreamSummary& s : r.streams) streams.push_back(s.name);
  for (const auto& [step, n] : r.divergent_ops_per_step) per_step.push_back({step, n});
  for (const auto& [step, p] : r.curve) curve.push_back({step, p.divergent_ops, p.max_relative});
  json by_rank = json::array();
  for (const auto& [rank, steps] : r.divergent_by_rank) {
    json s = json::array();
    for (const auto& [step, n] : steps) s.push_back({step, n});
    by_rank.push_back({rank, s});
  }
  json folds = {{"a", folds_json(r.replica_folds[0])}, {"b", folds_json(r.replica_folds[1])}};
  json resumes = json::array();
  for (const ResumedProcess& rp : r.resumes) resumes.push_back(resume_json(rp));
  json parameters = json::array();
  for (const ParameterDivergence& d : r.parameters)
    parameters.push_back({d.stream, d.position, d.op, d.first_step});
  *part = {{"schema", kPartSchema},
           {"run_a", fs::absolute(run_a).lexically_normal().string()},
           {"run_b", fs::absolute(run_b).lexically_normal().string()},
           {"ranks", options.ranks.to_json()},
           {"streams", streams},
           {"ops_compared", r.ops_compared},
           {"steps_seen", r.steps_seen},
           {"backward_passes", r.backward_passes},
           {"optimizer_ops", r.optimizer_ops},
           {"divergent_ops", r.divergent_ops},
           {"structural_count", r.structural_count},
           {"records_a", r.records_a},
           {"records_b", r.records_b},
           {"bytes_read", r.bytes_read},
           {"unread_differences", r.unread_differences},
           {"beyond_tolerance", r.beyond_tolerance},
           {"structure_tolerated", r.structure_tolerated},
           {"structure_matched", r.structure_matched},
           {"structure_same_bits", r.structure_same_bits},
           {"parameters_tracked", r.parameters_tracked},
           {"parameters", parameters},
           {"training",
            {{"writes_compared", r.training.writes_compared},
             {"divergent_writes", r.training.divergent_writes},
             {"divergent_outside", r.training.divergent_outside},
             {"outside", r.training.outside}}},
           {"per_step", per_step},
           {"curve", curve},
           {"by_rank", by_rank},
           {"not_compared", r.not_compared},
           {"notes", r.notes},
           {"candidates", candidates},
           {"resumes", resumes},
           {"numerics_change", numerics_json(r.numerics_change)},
           {"folds", folds},
           {"seconds", r.seconds}};
  return Status();
}

namespace {

// One part's counts, parameters and training writes added into *out.
void add_counts(const json& p, DiffReport* out) {
  DiffReport& r = *out;
  r.ops_compared += p.at("ops_compared").get<uint64_t>();
  r.steps_seen = std::max(r.steps_seen, p.value("steps_seen", uint64_t(0)));
  r.backward_passes = std::max(r.backward_passes, p.value("backward_passes", uint64_t(0)));
  r.optimizer_ops += p.value("optimizer_ops", uint64_t(0));
  r.divergent_ops += p.at("divergent_ops").get<uint64_t>();
  r.structural_count += p.at("structural_count").get<uint64_t>();
  r.records_a += p.at("records_a").get<uint64_t>();
  r.records_b += p.at("records_b").get<uint64_t>();
  r.bytes_read += p.at("bytes_read").get<uint64_t>();
  r.unread_differences += p.at("unread_differences").get<uint64_t>();
  r.beyond_tolerance = r.beyond_tolerance || p.at("beyond_tolerance").get<bool>();
  r.structure_tolerated = r.structure_tolerated || p.value("structure_tolerated", false);
  r.structure_matched += p.value("structure_matched", uint64_t(0));
  r.structure_same_bits += p.value("structure_same_bits", uint64_t(0));
  r.parameters_tracked += p.value("parameters_tracked", uint64_t(0));
  for (const json& d : p.value("parameters", json::array()))
    r.parameters.push_back({d.at(0).get<std::string>(), d.at(1).get<uint64_t>(),
                            d.at(2).get<std::string>(), d.at(3).get<uint64_t>()});
  // A part of an older detaudit has none: no training write compared, the gate fails closed.
  const json t = p.value("training", json::object());
  r.training.writes_compared += t.value("writes_compared", uint64_t(0));
  r.training.divergent_writes += t.value("divergent_writes", uint64_t(0));
  r.training.divergent_outside += t.value("divergent_outside", uint64_t(0));
  for (const json& o : t.value("outside", json::array()))
    if (r.training.outside.size() < TrainingCheck::kMaxOutside)
      r.training.outside.push_back(o.get<std::string>());
}

// Every part's counts, candidates and folds into *r, *candidates and folds; the parts must be of
// one pair of runs, their streams not overlapping.
Status read_parts(const std::vector<json>& parts, const std::vector<std::string>& sources,
                  DiffReport* out, std::vector<FirstDivergence>* candidates,
                  std::vector<RankFolds> folds[2]) {
  DiffReport& r = *out;
  std::set<std::string> streams, notes;
  try {
    for (size_t i = 0; i < parts.size(); ++i) {
      const json& p = parts[i];
      if (!p.is_object() || p.value("schema", "") != kPartSchema)
        return bad_part(sources[i], fmt::format("not a part of a diff (schema {})", kPartSchema));
      const std::string a = p.at("run_a").get<std::string>(), b = p.at("run_b").get<std::string>();
      if (i == 0) {
        r.run_a = a;
        r.run_b = b;
      } else if (a != r.run_a || b != r.run_b) {
        return Status::error(fmt::format(
            "{}: a part of the diff of {} and {}, not of {} and {}; merge the parts of one pair",
            sources[i], a, b, r.run_a, r.run_b));
      }
      for (const json& s : p.at("streams"))
        if (!streams.insert(s.get<std::string>()).second)
          return Status::error(fmt::format(
              "{}: stream {} is in another part too; give the parts ranks that do not overlap",
              sources[i], s.get<std::string>()));
      add_counts(p, &r);
      for (const json& e : p.at("per_step"))
        r.divergent_ops_per_step[e.at(0).get<uint64_t>()] += e.at(1).get<uint64_t>();
      for (const json& e : p.at("curve")) {
        StepPoint& q = r.curve[e.at(0).get<uint64_t>()];
        q.divergent_ops += e.at(1).get<uint64_t>();
        q.max_relative = std::max(q.max_relative, e.at(2).get<double>());
      }
      for (const json& e : p.at("by_rank")) {
        auto& lane = r.divergent_by_rank[e.at(0).get<int64_t>()];
        for (const json& s : e.at(1)) lane[s.at(0).get<uint64_t>()] += s.at(1).get<uint64_t>();
      }
      for (const json& line : p.at("not_compared"))
        r.not_compared.push_back(line.get<std::string>());
      for (const json& note : p.at("notes")) notes.insert(note.get<std::string>());
      for (const json& c : p.at("candidates")) candidates->push_back(candidate_from(c));
      for (const json& rp : p.value("resumes", json::array())) r.resumes.push_back(resume_from(rp));
      if (const json n = p.value("numerics_change", json()); n.is_object())
        keep_earliest_numerics_change(numerics_from(n), &r);
      folds_from(p.at("folds").at("a"), &folds[0]);
      folds_from(p.at("folds").at("b"), &folds[1]);
    }
  } catch (const json::exception& e) {
    return Status::error(
        fmt::format("a part of the diff is malformed ({}); write it again", e.what()),
        ExitCode::kBadInput);
  } catch (const std::invalid_argument& e) {
    return Status::error(
        fmt::format("a part of the diff is malformed ({}); write it again", e.what()),
        ExitCode::kBadInput);
  }
  r.notes.assign(notes.begin(), notes.end());
  return Status();
}

// The first divergence among every part's, by the whole diff's rule; its evidence from comparing
// that one stream again, its rank's streams selected again as its part did, a resume's windows
// included.
Status compare_first_again(const trace::RunDirectory& run_a, const trace::RunDirectory& run_b,
                           const Fingerprints fingerprints[2],
                           const std::vector<FirstDivergence>& candidates,
                           const std::vector<std::string>& sources, const DiffOptions& options,
                           StreamSelection* selection, DiffReport* out) {
  DiffReport& r = *out;
  std::vector<const FirstDivergence*> pointers;
  for (const FirstDivergence& c : candidates) pointers.push_back(&c);
  const FirstDivergence* first = causal_first(pointers);
  if (!first) return Status();
  StreamResult res;
  StreamLimits limits;
  limits.world_lost_a = lost_world(r.worlds[0]);
  limits.world_lost_b = lost_world(r.worlds[1]);
  RangeSet rank;
  std::vector<ResumedProcess> resumes;
  std::vector<std::string> resume_notes;
  if (first->rank >= 0)
    if (Status s = RangeSet::parse(json::array({uint64_t(first->rank)}), "ranks", &rank); !s.ok())
      return s;
  if (Status s = select_streams(run_a, run_b, rank, selection); !s.ok()) return s;
  if (Status s = find_resumes(selection, options.resume_step, &resumes, &resume_notes); !s.ok())
    return s;
  auto stream_a = selection->streams[0].find(first->stream);
  auto stream_b = selection->streams[1].find(first->stream);
  if (stream_a == selection->streams[0].end() || stream_b == selection->streams[1].end())
    return Status::error(fmt::format("{}: stream {} is no longer in both runs; were the runs "
                                     "recorded again since?",
                                     sources.front(), first->stream),
                         ExitCode::kBadInput);
  if (auto w = selection->windows.find(first->stream); w != selection->windows.end())
    limits.window = w->second;
  auto fingerprint = fingerprints[0].find(first->process);
  if (Status s = compare_stream(
          first->stream, stream_a->second, stream_b->second, options, r.environment, nullptr, &res,
          limits, fingerprint != fingerprints[0].end() ? &fingerprint->second : nullptr);
      !s.ok())
    return s;
  if (!res.first)
    return Status::error(fmt::format("{}: stream {} no longer diverges where its part said; "
                                     "were the runs recorded again since?",
                                     sources.front(), first->stream),
                         ExitCode::kBadInput);
  for (EnvDifference& d : res.step_settings) r.environment.push_back(std::move(d));
  r.first = *res.first;
  add_spread(pointers, &*r.first);
  return explain_first(&stream_a->second, r.environment, &*r.first);
}

}  // namespace

Status merge_parts(const std::vector<json>& parts, const std::vector<std::string>& sources,
                   const DiffOptions& options, DiffReport* report) {
  auto start = std::chrono::steady_clock::now();
  if (parts.empty()) return Status::error("merge: no parts given");
  DiffReport r;
  r.gate = options.gate;
  std::vector<FirstDivergence> candidates;
  std::vector<RankFolds> folds[2];  // run A's ranks', run B's
  if (Status s = read_parts(parts, sources, &r, &candidates, folds); !s.ok()) return s;

  // The whole runs' environments, worlds and replicas: every part saw them, the merge says them
  // once.
  trace::RunDirectory run_a, run_b;
  if (Status s = trace::RunDirectory::open(r.run_a, &run_a); !s.ok()) return s;
  if (Status s = trace::RunDirectory::open(r.run_b, &run_b); !s.ok()) return s;
  Fingerprints fingerprints[2];
  if (Status s = check_environment_and_world(run_a, run_b, &r, fingerprints); !s.ok()) return s;
  if (Status s = check_replicas_of_both(run_a, run_b, folds, /*part=*/false, &r); !s.ok()) return s;
  StreamSelection selection;
  if (Status s = compare_first_again(run_a, run_b, fingerprints, candidates, sources, options,
                                     &selection, &r);
      !s.ok())
    return s;
  finish_report(run_a, run_b, {}, /*part=*/false, &r);
  explain_resumes(selection, &r);
  note_training_identical(&r);
  if (r.verdict == Verdict::kUnexplained)
    r.unexplained = "no part held an op where the divergence began (diff the whole runs for why)";
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  *report = std::move(r);
  return Status();
}

}  // namespace detaudit
