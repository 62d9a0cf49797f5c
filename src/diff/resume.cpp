#include "diff/resume.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string_view>

#include "diff/classify.h"
#include "diff/environment.h"
#include "diff/step_states.h"
#include "run_layout.h"
#include "trace/reader.h"

namespace detaudit {
namespace {

// The ops of a resumed process's first step read at most this many: its setup and one step.
constexpr uint64_t kFirstStepOps = 1u << 20;

// "r0.main~1" -> "r0.main"; "" for a process that took no "~<k>".
std::string process_before(const std::string& process) {
  const size_t t = process.rfind('~');
  if (t == std::string::npos || t + 1 == process.size()) return "";
  for (size_t i = t + 1; i < process.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(process[i]))) return "";
  return process.substr(0, t);
}

uint64_t digest_key(const trace::TensorDesc& t) {
  uint64_t k;
  std::memcpy(&k, t.digest.data(), sizeof k);
  return k;
}

// A tensor whose bytes say where a process stands: read and digested, more than one element.
bool telling(const trace::TensorDesc* t) {
  return t && t->has_contents() && !t->uninitialized() && t->numel() > 1;
}

using ReadKey = std::pair<uint64_t, std::string>;  // a tensor's digest, the op that read it

// The resumed process's first step on its main thread: the first op to read each tensor, and
// every op's name in order.
struct FirstStep {
  std::map<ReadKey, uint64_t> reads;
  std::vector<std::string> names;
};

Status read_first_step(const std::string& path, FirstStep* out) {
  trace::TraceReader r;
  if (Status s = r.open(path); !s.ok()) return s;
  while (r.next() == trace::ReadResult::kRecord && out->names.size() < kFirstStepOps) {
    if (r.kind() != trace::RecordKind::kOp) continue;
    const trace::OpRecord& op = r.op();
    if (op.step > 0) break;
    std::string name(r.string(op.name));
    for (int64_t id : op.input_tensors)
      if (const trace::TensorDesc* t = r.tensor(id); telling(t))
        out->reads.try_emplace({digest_key(*t), name}, out->names.size());
    out->names.push_back(std::move(name));
  }
  return Status();
}

// Where the resumed process's first step meets the run that ran through: that run's step, its
// op there that reads what the resumed process read first (through_index, the step's first op
// at step_start), and the resumed process's op that read it.
struct Meeting {
  uint64_t step = 0, step_start = 0, through_index = 0, resumed_index = 0;
  std::string op;
  size_t tensors = 0;  // the tensors read at that step only
};

// A tensor read at several steps of the run that ran through (a constant, a batch seen again)
// tells nothing: the step is the one most of the others were read at, and only at.
Status find_meeting(const std::string& through_path, const FirstStep& first,
                    std::optional<Meeting>* out) {
  struct Hit {
    uint64_t step, index, resumed_index;
    std::string op;
    bool repeated = false;
  };
  std::map<ReadKey, Hit> hits;
  std::map<uint64_t, uint64_t> step_start;
  trace::TraceReader r;
  if (Status s = r.open(through_path); !s.ok()) return s;
  for (uint64_t index = 0; r.next() == trace::ReadResult::kRecord;) {
    if (r.kind() != trace::RecordKind::kOp) continue;
    const trace::OpRecord& op = r.op();
    step_start.try_emplace(op.step, index);
    for (int64_t id : op.input_tensors) {
      const trace::TensorDesc* t = r.tensor(id);
      if (!telling(t)) continue;
      ReadKey key{digest_key(*t), std::string(r.string(op.name))};
      auto read = first.reads.find(key);
      if (read == first.reads.end()) continue;
      auto [hit, added] = hits.try_emplace(key, Hit{op.step, index, read->second, key.second});
      if (!added && hit->second.step != op.step) hit->second.repeated = true;
    }
    ++index;
  }
  std::map<uint64_t, size_t> votes;
  for (const auto& [key, hit] : hits)
    if (!hit.repeated && hit.step > 0) ++votes[hit.step];
  uint64_t best = 0;
  size_t most = 0;
  for (const auto& [step, n] : votes)
    if (n > most) std::tie(best, most) = std::pair{step, n};
  if (most == 0) return Status();
  Meeting m;
  m.step = best;
  m.step_start = step_start[best];
  m.tensors = most;
  // The resumed process's first such read: an op the other run ran earlier in that step (an EMA
  // updated after the step before, counted in this one) may read the same tensor by the same op
  // as one of the resumed process's later ops (the optimizer's add_ of a parameter).
  m.through_index = m.resumed_index = UINT64_MAX;
  for (const auto& [key, hit] : hits)
    if (!hit.repeated && hit.step == best &&
        std::pair{hit.resumed_index, hit.index} < std::pair{m.resumed_index, m.through_index}) {
      m.through_index = hit.index;
      m.resumed_index = hit.resumed_index;
      m.op = hit.op;
    }
  *out = m;
  return Status();
}

// The names of the ops of `path` from op index `from` up to `to` (excluded).
Status op_names(const std::string& path, uint64_t from, uint64_t to,
                std::vector<std::string>* names) {
  trace::TraceReader r;
  if (Status s = r.open(path); !s.ok()) return s;
  for (uint64_t index = 0; index < to && r.next() == trace::ReadResult::kRecord;) {
    if (r.kind() != trace::RecordKind::kOp) continue;
    if (index >= from) names->emplace_back(r.string(r.op().name));
    ++index;
  }
  return Status();
}

// "r0.main~1.t-main" for "r0.main.t-main", the stream of `before` renamed to `after`'s.
std::string renamed(const std::string& stream, const std::string& before,
                    const std::string& after) {
  return after + stream.substr(before.size());
}

bool of_process(const std::string& stream, const std::string& process) {
  return stream.size() > process.size() && stream.compare(0, process.size(), process) == 0 &&
         stream[process.size()] == '.';
}

// A resumed process's library pools are compared within its predecessor's: together they ran
// what the other run's one process did, plus the setup the resumed process ran again.
void join_pools(StreamSelection* selection, const ResumedProcess& rp) {
  std::vector<PoolKey> keys;
  for (const auto& [key, _] : selection->pools)
    if (key.first == rp.process) keys.push_back(key);
  for (const PoolKey& key : keys) {
    const PoolKey into{rp.continues, key.second};
    PoolComparison& from = selection->pools.at(key);
    PoolComparison& c = selection->pools[into];
    c.process = rp.continues;
    c.pool = from.pool;
    c.resumed_run = rp.run;
    auto& streams = rp.run == 0 ? c.streams_a : c.streams_b;
    for (const std::string& s : rp.run == 0 ? from.streams_a : from.streams_b) streams.push_back(s);
    auto& paths = selection->pool_paths[key];
    auto& into_paths = selection->pool_paths[into];
    for (const std::string& p : rp.run == 0 ? paths.first : paths.second) {
      (rp.run == 0 ? into_paths.first : into_paths.second).push_back(p);
      c.resumed_paths.push_back(p);
    }
    selection->pools.erase(key);
    selection->pool_paths.erase(key);
  }
}

// The first step before `limit` at which an op of `path` read or made a tensor of this digest.
std::optional<uint64_t> step_that_read(const std::string& path, const std::string& digest,
                                       uint64_t limit) {
  trace::TraceReader r;
  if (digest.empty() || !r.open(path).ok()) return std::nullopt;
  while (r.next() == trace::ReadResult::kRecord) {
    if (r.kind() != trace::RecordKind::kOp) continue;
    const trace::OpRecord& op = r.op();
    if (op.step >= limit) break;
    for (const auto* ids : {&op.input_tensors, &op.output_tensors})
      for (int64_t id : *ids)
        if (const trace::TensorDesc* t = r.tensor(id); telling(t) && t->digest_hex() == digest)
          return op.step;
  }
  return std::nullopt;
}

// The op of `path` that wrote a tensor of this digest last before step `step` read it, and the
// step it ran in: the writes that end a step (GradScaler's update) run after its last
// optimizer op, at the next step's count.
struct Writer {
  std::string op;
  uint64_t step = 0;
  bool optimizer = false;  // an optimizer-phase op: a parameter or its state
};

std::optional<Writer> last_writer(const std::string& path, const std::string& digest,
                                  uint64_t step) {
  trace::TraceReader r;
  if (digest.empty() || !r.open(path).ok()) return std::nullopt;
  std::optional<Writer> writer;
  while (r.next() == trace::ReadResult::kRecord) {
    if (r.kind() != trace::RecordKind::kOp) continue;
    const trace::OpRecord& op = r.op();
    if (op.step > step) break;
    if (op.step == step && writer)
      for (int64_t id : op.input_tensors)
        if (const trace::TensorDesc* t = r.tensor(id);
            t && t->has_contents() && t->digest_hex() == digest)
          return writer;
    for (int64_t id : op.output_tensors)
      if (const trace::TensorDesc* t = r.tensor(id);
          t && t->has_contents() && t->digest_hex() == digest)
        writer = Writer{std::string(r.string(op.name)), op.step,
                        op.phase == trace::Phase::kOptimizer};
  }
  return writer;
}

// Made or read beside training, reaching none of it: an evaluation's, a logged sum, an EMA.
bool kept_outside_training(TensorRole role) {
  return role == TensorRole::kEvaluation || role == TensorRole::kOutsideTraining;
}

bool one_element(const TensorSide& t) { return t.present && t.has_stats && t.numel() == 1; }

// A tensor of zeros (a scalar included) where the other run's is not: a running value the
// resumed process started again from 0.
bool zeros_against_values(const TensorSide& resumed, const TensorSide& through) {
  return resumed.present && through.present && resumed.has_stats && through.has_stats &&
         resumed.stats.min == 0 && resumed.stats.max == 0 &&
         !(through.stats.min == 0 && through.stats.max == 0);
}

// A first divergence in a resumed stream, with what the handlers below ask of it.
struct ResumeDivergence {
  const StreamSelection& selection;
  const DiffReport& report;
  ResumedProcess& rp;
  FirstDivergence& f;

  char resumed() const { return rp.run == 0 ? 'A' : 'B'; }
  char through() const { return rp.run == 0 ? 'B' : 'A'; }
  const TensorSide& resumed_side(const TensorPair& p) const { return rp.run == 0 ? p.a : p.b; }
  const TensorSide& through_side(const TensorPair& p) const { return rp.run == 0 ? p.b : p.a; }
  // The trace of the run that went through that this stream is compared with.
  const std::string* through_trace() const {
    auto it = selection.streams[1 - rp.run].find(f.stream);
    return it == selection.streams[1 - rp.run].end() ? nullptr : &it->second;
  }
  // The trace of `process`'s main thread in the run that resumed (it or the one it continues).
  const std::string* main_stream(const std::string& process) const {
    auto it = selection.streams[rp.run].find(layout::stream_name(process, "main"));
    return it == selection.streams[rp.run].end() ? nullptr : &it->second;
  }
  // "; the optimizer's N written tensors all agree<tail>", when they were tracked and do.
  std::string training_agrees(std::string_view tail) const {
    if (!report.parameters.empty() || report.parameters_tracked == 0) return "";
    return fmt::format("; the optimizer's {} written tensors all agree{}",
                       report.parameters_tracked, tail);
  }
};

// A stream's steps, in its own numbering; empty when it cannot be read (the diff says why).
std::vector<trace::StepInfo> steps_of(const std::string* path) {
  std::vector<trace::StepInfo> steps;
  if (path) (void)read_steps(*path, &steps);
  return steps;
}

// The digest `field` of the step numbered `step` (`shift` subtracted), 0 where there is none.
uint64_t digest_at(const std::vector<trace::StepInfo>& steps, uint64_t trace::StepInfo::*field,
                   uint64_t step, uint64_t shift = 0) {
  if (step < shift) return 0;
  for (const trace::StepInfo& s : steps)
    if (s.step == step - shift) return s.*field;
  return 0;
}

// A random op of a resumed process's setup (its first `setup_ops` ops) that drew from a generator
// in state `rng`; "" when none did.
std::string setup_draw_from(const std::string* path, uint64_t setup_ops, uint64_t rng) {
  trace::TraceReader r;
  if (!path || rng == 0 || !r.open(*path).ok()) return "";
  for (uint64_t index = 0; index < setup_ops && r.next() == trace::ReadResult::kRecord;) {
    if (r.kind() != trace::RecordKind::kOp) continue;
    const trace::OpRecord& op = r.op();
    if (op.step > 0) break;
    if (op.has_rng() && op.rng == rng) return std::string(r.string(op.name));
    ++index;
  }
  return "";
}

// torch's CPU generator restored, then drawn in the resumed process's setup: its state as an op
// of the setup drew is the other run's at the resume step.
bool drawn_after_restoring(ResumeDivergence& d) {
  const uint64_t at_resume = digest_at(steps_of(d.through_trace()), &trace::StepInfo::rng_cpu,
                                       d.rp.step);
  const std::string draw = setup_draw_from(d.main_stream(d.rp.process), d.rp.setup_ops, at_resume);
  if (draw.empty()) return false;
  d.rp.missing =
      "torch's CPU generator as it stood at the resume (drawn again in the resumed process's "
      "setup)";
  d.f.explanation.cause = fmt::format(
      "torch's CPU generator was restored, then drawn before step {}: {} in run {}'s {}'s setup "
      "drew from it in run {}'s state at step {} ({:016x}), so {} drew other random numbers "
      "(generator state {:016x} in run A, {:016x} in run B); a DataLoader iterator made at the "
      "resume draws its seed from it",
      d.rp.step, draw, d.resumed(), d.rp.process, d.through(), d.rp.step, at_resume, d.f.op,
      d.f.evidence.rng_a, d.f.evidence.rng_b);
  d.f.explanation.remedy =
      "give the DataLoader a generator of its own (DataLoader(..., generator=torch.Generator()"
      ".manual_seed(s))), or restore torch's generator after the resumed loader's iterator is "
      "made";
  return true;
}

bool missed_generator(ResumeDivergence& d) {
  const bool cuda = !on_cpu(d.f);
  if (!cuda && drawn_after_restoring(d)) return true;
  d.rp.missing = cuda ? "torch's CUDA generator" : "torch's CPU generator";
  d.f.explanation.cause = fmt::format(
      "the checkpoint did not restore {}: run {}'s {} resumed at step {} and {} drew other "
      "random numbers (generator state {:016x} in run A, {:016x} in run B)",
      d.rp.missing, d.resumed(), d.rp.process, d.rp.step, d.f.op, d.f.evidence.rng_a,
      d.f.evidence.rng_b);
  d.f.explanation.remedy = fmt::format(
      "save {} with the checkpoint and restore it after loading (with NumPy's and Python's: "
      "numpy.random.get_state(), random.getstate()); a Hugging Face Trainer checkpoint holds "
      "them, unless saved with TrainingArguments(save_only_model=True), which leaves out the "
      "optimizer's and scheduler's state too: resume from a full one; a Lightning checkpoint "
      "does not: save them in the "
      "LightningModule's on_save_checkpoint and restore them in its on_load_checkpoint",
      cuda ? "torch.cuda.get_rng_state_all()" : "torch.get_rng_state()");
  return true;
}

// The first step before `limit` at which an op of `path` named `op` drew with generator state
// `rng`.
std::optional<uint64_t> step_that_drew(const std::string& path, const std::string& op, uint64_t rng,
                                       uint64_t limit) {
  trace::TraceReader r;
  if (!r.open(path).ok()) return std::nullopt;
  while (r.next() == trace::ReadResult::kRecord) {
    if (r.kind() != trace::RecordKind::kOp) continue;
    const trace::OpRecord& o = r.op();
    if (o.step >= limit) break;
    if (o.has_rng() && o.rng == rng && r.string(o.name) == op) return o.step;
  }
  return std::nullopt;
}

// A random op drew in another state while torch's default generator continued exactly (its
// state agrees after the resumed process's first step): a generator of the program's own, seeded
// from a count the checkpoint did not carry, as a sampler's epoch.
bool missed_own_generator(ResumeDivergence& d) {
  const std::string* through = d.through_trace();
  const std::string* resumed_path = d.main_stream(d.rp.process);
  if (!through || !resumed_path) return false;
  const bool cuda = !on_cpu(d.f);
  const auto field = cuda ? &trace::StepInfo::rng_cuda : &trace::StepInfo::rng_cpu;
  const uint64_t other = digest_at(steps_of(through), field, d.rp.step + 1);
  const uint64_t resumed = digest_at(steps_of(resumed_path), field, d.rp.step + 1, d.rp.step);
  if (other == 0 || other != resumed) return false;
  const uint64_t drew = d.rp.run == 0 ? d.f.evidence.rng_a : d.f.evidence.rng_b;
  const auto earlier = step_that_drew(*through, d.f.op, drew, d.rp.step);
  d.rp.missing = "what seeds a generator of the program's own (a sampler's epoch)";
  d.f.explanation.cause = fmt::format(
      "the checkpoint did not restore what seeds a generator of the program's own: torch's "
      "default generator continued exactly after run {}'s resume (its state agrees after step "
      "{}), but {} drew with a generator in another state ({:016x} in run A, {:016x} in run "
      "B){}: one seeded from a count that started over, as a sampler's epoch",
      d.resumed(), d.rp.step, d.f.op, d.f.evidence.rng_a, d.f.evidence.rng_b,
      earlier ? fmt::format(", the state run {}'s {} drew with at step {}", d.through(), d.f.op,
                            *earlier)
              : "");
  d.f.explanation.remedy =
      "save the sampler's epoch with the checkpoint and call sampler.set_epoch(epoch) when "
      "resuming (DistributedSampler seeds its shuffle with seed + epoch); a torch.Generator the "
      "program keeps: save its get_state() and restore it with set_state()";
  return true;
}

// NumPy's and Python's generators, as the interposer's Python hooks note them at the end of each
// optimizer step (trace::StepInfo): alike in both runs as the stopped process reached the resume
// step, other after the resumed process's first step. What it drew from them there differs.
bool missed_python_generator(ResumeDivergence& d) {
  const auto other = steps_of(d.through_trace()), stopped = steps_of(d.main_stream(d.rp.continues)),
             resumed = steps_of(d.main_stream(d.rp.process));
  struct Generator {
    uint64_t trace::StepInfo::*field;
    const char* name;
  };
  std::vector<std::string> missed;
  uint64_t first_a = 0, first_b = 0;
  for (const Generator& g : {Generator{&trace::StepInfo::rng_numpy, "NumPy's generator"},
                             Generator{&trace::StepInfo::rng_python, "Python's generator"}}) {
    const uint64_t before = digest_at(other, g.field, d.rp.step),
                   after = digest_at(other, g.field, d.rp.step + 1);
    const uint64_t resumed_after = digest_at(resumed, g.field, d.rp.step + 1, d.rp.step);
    if (before == 0 || before != digest_at(stopped, g.field, d.rp.step) || after == 0 ||
        resumed_after == 0 || after == resumed_after)
      continue;
    if (missed.empty()) {
      first_a = d.rp.run == 0 ? resumed_after : after;
      first_b = d.rp.run == 0 ? after : resumed_after;
    }
    missed.push_back(g.name);
  }
  if (missed.empty()) return false;
  d.rp.missing = fmt::format("{}", fmt::join(missed, " and "));
  classify_resumed_generator(fmt::format("{} noted at the end of step {}: {:016x} vs {:016x}",
                                         missed.front(), d.rp.step, first_a, first_b),
                             &d.f);
  d.f.explanation.cause = fmt::format(
      "the checkpoint did not restore {}: its state was the same in both runs as the stopped "
      "process reached step {}, and differs after run {}'s resumed process ran that step "
      "({:016x} in run A, {:016x} in run B): {}'s differing input, data made outside torch, "
      "is what was drawn from it",
      d.rp.missing, d.rp.step, d.resumed(), first_a, first_b, d.f.op);
  d.f.explanation.remedy =
      "save numpy.random.get_state() and random.getstate() with the checkpoint and restore them "
      "with numpy.random.set_state() and random.setstate() when resuming (with torch's: "
      "torch.get_rng_state()); a Hugging Face Trainer checkpoint holds them (rng_state.pth): "
      "resume from it; a Lightning checkpoint does not: save them in the LightningModule's "
      "on_save_checkpoint and restore them in its on_load_checkpoint";
  return true;
}

bool missed_hyperparameter(ResumeDivergence& d) {
  if (d.f.evidence.scalar_argument.empty()) return false;
  d.rp.missing = "a hyperparameter (a scheduler's or a GradScaler's state)";
  d.f.explanation.cause = fmt::format(
      "the checkpoint did not restore a hyperparameter: at step {}, after run {}'s resume, {} "
      "took {} (run A vs run B)",
      d.f.step, d.resumed(), d.f.op, d.f.evidence.scalar_argument);
  d.f.explanation.remedy =
      "save the scheduler's and the GradScaler's state_dict() with the checkpoint and load "
      "them when resuming, with the optimizer's";
  return true;
}

// The tensors the optimizer wrote at step `step` of `path` that the forward or backward pass
// read at the step after: the parameters (its state is read by the optimizer only). Constant
// tensors (gradients zeroed in the optimizer's phase) tell nothing.
std::set<std::string> parameters_read_after(const std::string& path, uint64_t step) {
  std::set<std::string> written, read;
  trace::TraceReader r;
  if (!r.open(path).ok()) return read;
  while (r.next() == trace::ReadResult::kRecord) {
    if (r.kind() != trace::RecordKind::kOp) continue;
    const trace::OpRecord& op = r.op();
    if (op.step > step + 1) break;
    if (op.step == step && op.phase == trace::Phase::kOptimizer)
      for (int64_t id : op.output_tensors)
        if (const trace::TensorDesc* t = r.tensor(id); telling(t) && t->stats.min != t->stats.max)
          written.insert(t->digest_hex());
    if (op.step == step + 1 && op.phase != trace::Phase::kOptimizer)
      for (int64_t id : op.input_tensors)
        if (const trace::TensorDesc* t = r.tensor(id); telling(t) && written.count(t->digest_hex()))
          read.insert(t->digest_hex());
  }
  return read;
}

// How many of `digests` the forward or backward pass of the first step of `path` read.
size_t first_step_reads(const std::string& path, const std::set<std::string>& digests) {
  size_t n = 0;
  trace::TraceReader r;
  if (!r.open(path).ok()) return 0;
  while (r.next() == trace::ReadResult::kRecord) {
    if (r.kind() != trace::RecordKind::kOp) continue;
    if (r.op().step > 0) break;
    if (r.op().phase == trace::Phase::kOptimizer) continue;
    for (int64_t id : r.op().input_tensors)
      if (const trace::TensorDesc* t = r.tensor(id); telling(t))
        n += digests.count(t->digest_hex());
  }
  return n;
}

// The parameters the optimizer left before the resume step, which the run that went through read
// at that step, read by none of the resumed process's first step's ops: not loaded, or changed at
// load (a dtype cast, an EMA saved in their place).
bool missed_parameters(ResumeDivergence& d) {
  const std::string* through = d.through_trace();
  auto resumed = d.selection.streams[d.rp.run].find(d.f.stream);
  if (!through || resumed == d.selection.streams[d.rp.run].end() || d.rp.step == 0) return false;
  const std::set<std::string> parameters = parameters_read_after(*through, d.rp.step - 1);
  if (parameters.empty() || first_step_reads(resumed->second, parameters) > 0) return false;
  d.rp.missing = "the parameters";
  d.f.explanation.cause = fmt::format(
      "the checkpoint's parameters were not loaded as saved: run {} read {} tensor(s) at step "
      "{} that its optimizer wrote at step {}, and run {}'s resumed process read none of them "
      "(not loaded, or changed at load: a dtype cast, an EMA saved in their place)",
      d.through(), parameters.size(), d.rp.step, d.rp.step - 1, d.resumed());
  d.f.explanation.remedy =
      "load the model's state_dict() from the checkpoint before the first step, in the dtype it "
      "was saved in; keep an EMA apart from the weights it averages, and save both";
  return true;
}

// A batch the run that went through read at an earlier step.
bool missed_data_order(ResumeDivergence& d) {
  const std::string* through = d.through_trace();
  for (const TensorPair& p : d.f.evidence.inputs) {
    // Data entering training: not a parameter, nor a value kept beside it (an EMA's weights).
    if (!p.differs || !through || is_training_state(p.tensor_role) ||
        kept_outside_training(p.tensor_role))
      continue;
    std::optional<uint64_t> earlier = step_that_read(*through, d.resumed_side(p).digest, d.rp.step);
    if (!earlier) continue;
    d.rp.missing = "the data order";
    classify_resumed_data_order(&d.f);
    d.f.explanation.cause = fmt::format(
        "the checkpoint did not restore the data order: run {}'s step {} read the batch run {} "
        "read at step {} ({} {}): its data loader started over",
        d.resumed(), d.f.step, d.through(), *earlier, d.f.op, p.label());
    d.f.explanation.remedy =
        "save the sampler's epoch and how many batches the epoch consumed with the checkpoint, "
        "and skip them when resuming (Hugging Face Trainer does unless ignore_data_skip is set; "
        "torchdata's StatefulDataLoader saves its place)";
    return true;
  }
  return false;
}

// A one-element tensor an op of the run that went through wrote: the GradScaler's scale
// (aten::_amp_update_scale_), or another state kept in a tensor.
bool missed_tensor_state(ResumeDivergence& d) {
  const std::string* through = d.through_trace();
  for (const TensorPair& p : d.f.evidence.inputs) {
    const TensorSide &resumed = d.resumed_side(p), &other = d.through_side(p);
    if (!through || !p.differs || !one_element(resumed) || !one_element(other) ||
        zeros_against_values(resumed, other))
      continue;
    const auto writer = last_writer(*through, other.digest, d.rp.step);
    if (!writer) continue;
    const bool scaler = writer->op == "aten::_amp_update_scale_";
    d.rp.missing = scaler ? "the GradScaler's scale" : "a state held in a one-element tensor";
    d.f.explanation.cause = fmt::format(
        "the checkpoint did not restore {}: at step {}, {}'s {} is {:.9g} in run {}'s resumed "
        "process and {:.9g} in run {}, as {} left it {}{}",
        scaler ? "the GradScaler's state" : "a state held in a one-element tensor", d.f.step,
        d.f.op, p.label(), resumed.stats.max, d.resumed(), other.stats.max, d.through(), writer->op,
        writer->step == d.f.step ? "before that step" : fmt::format("at step {}", writer->step),
        d.training_agrees(scaler ? " (a power-of-two scale cancels when the gradients are "
                                   "unscaled), but the scale decides which steps an overflow "
                                   "skips"
                                 : ""));
    d.f.explanation.remedy = scaler
                                 ? "save scaler.state_dict() with the checkpoint and call "
                                   "scaler.load_state_dict() when resuming (a Hugging Face Trainer "
                                   "checkpoint holds it: resume from it)"
                                 : fmt::format(
                                       "save the tensor {} writes with the checkpoint, and load "
                                       "it when resuming",
                                       writer->op);
    return true;
  }
  return false;
}

// A tensor only the optimizer writes and reads (a moment, a step count) that the resumed process
// made anew: the optimizer's state_dict() was not loaded.
bool missed_optimizer_state(ResumeDivergence& d) {
  const TensorPair* state = nullptr;
  for (const auto* pairs : {&d.f.evidence.inputs, &d.f.evidence.outputs})
    for (const TensorPair& p : *pairs)
      if (!state && p.differs && p.tensor_role == TensorRole::kOptimizerState) state = &p;
  if (!state) return false;
  const TensorSide &resumed = d.resumed_side(*state), &through = d.through_side(*state);
  d.rp.missing = "the optimizer's state";
  d.f.explanation.cause = fmt::format(
      "the checkpoint did not restore the optimizer's state: {}'s state (what only its steps "
      "write and read: step counts, moments) started anew in run {}'s resumed process at step "
      "{}{}; {} of the optimizer's {} written tensors diverged from there",
      d.f.optimizer.empty() ? "the optimizer" : d.f.optimizer, d.resumed(), d.rp.step,
      one_element(resumed) && one_element(through)
          ? fmt::format(" ({}'s {} is {:.9g} there, {:.9g} in run {})", d.f.op, state->label(),
                        resumed.stats.max, through.stats.max, d.through())
          : "",
      d.report.parameters.size(), d.report.parameters_tracked);
  d.f.explanation.remedy =
      "save optimizer.state_dict() with the checkpoint and call optimizer.load_state_dict() "
      "when resuming (a Hugging Face Trainer checkpoint holds it, as does Lightning's: resume "
      "from it, not from the model's weights alone)";
  return true;
}

// A count outside training (added to by a number) the resumed process started again from 0.
bool missed_counter(ResumeDivergence& d, const TensorPair& p) {
  d.rp.missing = "a count kept in a tensor (a model buffer: BatchNorm's num_batches_tracked)";
  d.f.explanation.cause = fmt::format(
      "the checkpoint did not carry a count kept in a tensor: at step {}, {} counts on from 0 "
      "in run {}'s resumed process and from {:.9g} in run {} ({}), as a model's buffers do "
      "when its state_dict() is loaded without them (BatchNorm's num_batches_tracked, and its "
      "running statistics with it){}",
      d.f.step, d.f.op, d.resumed(), d.through_side(p).stats.max, d.through(), p.label(),
      d.training_agrees(": training in train mode is the same, evaluation with the running "
                        "statistics is not"));
  d.f.explanation.remedy =
      "load the model's whole state_dict(), buffers included (load_state_dict(strict=True) "
      "says what is missing); a count of one's own: save it with the checkpoint";
  return true;
}

// An accumulator outside training the resumed process started again from 0.
bool missed_running_value(ResumeDivergence& d) {
  for (const TensorPair& p : d.f.evidence.inputs) {
    if (!p.differs || is_training_state(p.tensor_role) ||
        !zeros_against_values(d.resumed_side(p), d.through_side(p)))
      continue;
    // Added to by what no recorded op made (a number): a count, as BatchNorm's
    // num_batches_tracked; a sum adds what the step computed (a loss).
    if (std::all_of(d.f.evidence.inputs.begin(), d.f.evidence.inputs.end(),
                    [&](const TensorPair& q) {
                      return &q == &p || d.through_side(q).provenance == "external";
                    }))
      return missed_counter(d, p);
    d.rp.missing = "a running value (an accumulator the resumed process starts from 0)";
    d.f.explanation.cause = fmt::format(
        "the checkpoint did not carry a running value: at step {}, {}'s {} is 0 in run {}'s "
        "resumed process and {:.9g} in run {}, which kept adding to it (a loss summed for "
        "logging, as Trainer's tr_loss){}",
        d.f.step, d.f.op, p.label(), d.resumed(), d.through_side(p).stats.max, d.through(),
        d.training_agrees(": training is the same, what is computed from that value (a logged "
                          "loss) is not"));
    d.f.explanation.remedy = fmt::format(
        "{}save the running value with the checkpoint, or reset it where the run that went "
        "through would (at each logging step)",
        d.report.training.identical
            ? "nothing to fix for training, which continues exactly; for the logged value to "
              "continue too, "
            : "");
    return true;
  }
  return false;
}

// A batch the resumed process took from DataLoader workers, not one the other run read earlier:
// the loader made at the resume started its workers' generators over (each is seeded from the
// loader's base seed), so what its Dataset draws there (an augmentation) is drawn anew.
bool missed_worker_draws(ResumeDivergence& d) {
  if (d.rp.workers.empty()) return false;
  for (const TensorPair& p : d.f.evidence.inputs) {
    if (!p.differs ||
        (p.tensor_role != TensorRole::kBatch && p.tensor_role != TensorRole::kUnknown))
      continue;
    d.rp.missing = "what the DataLoader's workers draw (their generators started over)";
    d.f.explanation.cause = fmt::format(
        "the checkpoint did not restore what the DataLoader's workers draw: at step {}, run {}'s "
        "resumed process read a batch from its workers ({}) that differs from run {}'s and is "
        "none run {} read before ({} {}): a loader made at the resume seeds its workers' "
        "generators anew, so what the Dataset draws in them (an augmentation) is drawn anew",
        d.f.step, d.resumed(), fmt::join(d.rp.workers, ", "), d.through(), d.through(), d.f.op,
        p.label());
    d.f.explanation.remedy =
        "draw what __getitem__ draws from a generator seeded by the sample (torch.Generator()"
        ".manual_seed(seed + epoch * len(dataset) + index)), or save and restore the loader "
        "itself (torchdata's StatefulDataLoader; with persistent_workers=True its workers keep "
        "their generators across epochs, which only its state carries)";
    return true;
  }
  return false;
}

// A value outside training the run that went through carried across the resume step, which the
// resumed process made anew: an EMA of the weights (kept with autograd off), a metric.
bool missed_value_outside_training(ResumeDivergence& d) {
  for (const TensorPair& p : d.f.evidence.inputs) {
    if (!p.differs || !kept_outside_training(p.tensor_role)) continue;
    const std::string* through = d.through_trace();
    const auto writer = through ? last_writer(*through, d.through_side(p).digest, d.f.step)
                                : std::nullopt;
    if (!writer || writer->step >= d.f.step) continue;  // made in this step: not carried over
    const bool grad_off = p.tensor_role == TensorRole::kEvaluation;
    d.rp.missing = grad_off ? "a value kept outside training with autograd off (an EMA of the "
                              "weights)"
                            : "a value kept outside training (a metric, a running sum)";
    d.f.explanation.cause = fmt::format(
        "the checkpoint did not carry {}: at step {}, {}'s {} is what run {}'s resumed process "
        "made anew, where run {} read what {} left at step {}{}",
        d.rp.missing, d.f.step, d.f.op, p.label(), d.resumed(), d.through(), writer->op,
        writer->step,
        d.training_agrees(": training continues exactly, what is computed from that value "
                          "(an EMA model's evaluation) does not"));
    d.f.explanation.remedy =
        "save it with the checkpoint and load it when resuming (an EMA: its own state_dict() "
        "beside the model's, as timm's ModelEmaV3 and torch.optim.swa_utils.AveragedModel "
        "keep it)";
    return true;
  }
  return false;
}

// The state the checkpoint did not restore, as the first divergence's cause and remedy.
bool name_what_was_missed(const StreamSelection& selection, const DiffReport& r, ResumedProcess* rp,
                          FirstDivergence* f) {
  ResumeDivergence d{selection, r, *rp, *f};
  if (f->divergence_class == DivergenceClass::kRngState)
    return missed_own_generator(d) || missed_generator(d);
  if (f->divergence_class != DivergenceClass::kExternalInput &&
      f->divergence_class != DivergenceClass::kInputDiffers)
    return false;
  for (bool (*missed)(ResumeDivergence&) :
       {missed_python_generator, missed_hyperparameter, missed_parameters, missed_optimizer_state,
        missed_data_order, missed_tensor_state, missed_running_value, missed_value_outside_training,
        missed_worker_draws})
    if (missed(d)) return true;
  return false;
}

bool dataloader_worker(const StreamSelection& selection, const std::string& process) {
  for (const auto& [name, head] : selection.heads)
    if (head.process == process) return head.dataloader_worker;
  return false;
}

// The DataLoader workers of a resumed process ("r0.main.0~1", a worker of "r0.main" named
// after the one before it) are not paired by name: a loader made at the resume hands its
// batches out from its first worker again, so worker k makes other batches than its namesake
// did. Each batch is compared where the resumed process's main thread reads it.
void set_aside_workers(StreamSelection* selection, const std::set<std::string>& processes,
                       const std::set<std::string>& other_run, ResumedProcess* rp,
                       std::vector<std::string>* notes) {
  for (const std::string& process : processes) {
    const std::string before = process_before(process);
    if (before.empty() || other_run.count(process) || parent_process(before) != rp->continues ||
        !dataloader_worker(*selection, process))
      continue;
    auto& streams = selection->streams[rp->run];
    for (auto it = streams.begin(); it != streams.end();)
      it = of_process(it->first, process) ? streams.erase(it) : std::next(it);
    for (auto it = selection->heads.begin(); it != selection->heads.end();)
      it = it->second.process == process ? selection->heads.erase(it) : std::next(it);
    rp->workers.push_back(process);
  }
  if (!rp->workers.empty())
    notes->push_back(fmt::format(
        "run {}'s {} took its batches from DataLoader workers ({}) that are not compared op by "
        "op: a loader made at the resume hands its batches out from its first worker again, so "
        "a worker makes other batches than the one of its name in the other run; each batch is "
        "compared where {}'s main thread reads it",
        rp->run == 0 ? 'A' : 'B', rp->process, fmt::join(rp->workers, ", "), rp->process));
}

// The first process against the steps before the resume; the resumed one against the rest,
// its own steps counted on from the resume step, its main thread's setup (and the other run's
// ops of that step before the meeting, `skip_through`) passed over.
void window_resumed_streams(const ResumedProcess& rp, uint64_t skip_through,
                            StreamSelection* selection) {
  const int resumed = rp.run, through = 1 - rp.run;
  const std::string main = layout::stream_name(rp.process, "main");
  std::vector<std::pair<std::string, std::string>> streams_before;
  for (const auto& [name, path] : selection->streams[through])
    if (of_process(name, rp.continues)) streams_before.emplace_back(name, path);
  for (const auto& [name, path] : streams_before) {
    selection->windows[name].until_step = rp.step - 1;
    const std::string resumed_name = renamed(name, rp.continues, rp.process);
    if (!selection->streams[resumed].count(resumed_name)) continue;
    selection->streams[through][resumed_name] = path;
    StreamWindow& w = selection->windows[resumed_name];
    w.first_step[through] = rp.step;
    w.step_shift[resumed] = rp.step;
    w.resume_step = rp.step;
    w.resumed_run = resumed;
    if (resumed_name == main) {
      w.skip[resumed] = rp.setup_ops;
      w.skip[through] = skip_through;
    }
  }
}

}  // namespace

Status find_resumes(StreamSelection* selection, std::optional<uint64_t> given,
                    std::vector<ResumedProcess>* out, std::vector<std::string>* notes) {
  std::set<std::string> processes[2];
  for (int side = 0; side < 2; ++side)
    for (const auto& [name, path] : selection->streams[side])
      processes[side].insert(selection->heads.at(name).process);
  for (int resumed = 0; resumed < 2; ++resumed) {
    const int through = 1 - resumed;
    for (const std::string& process : processes[resumed]) {
      const std::string before = process_before(process);
      if (before.empty() || processes[through].count(process) ||
          !processes[through].count(before) || !processes[resumed].count(before) ||
          dataloader_worker(*selection, process))
        continue;
      const std::string main = layout::stream_name(process, "main");
      const std::string main_before = layout::stream_name(before, "main");
      auto resumed_main = selection->streams[resumed].find(main);
      auto through_main = selection->streams[through].find(main_before);
      if (resumed_main == selection->streams[resumed].end() ||
          through_main == selection->streams[through].end())
        continue;
      ResumedProcess rp;
      rp.run = resumed;
      rp.process = process;
      rp.continues = before;
      FirstStep first;
      if (Status s = read_first_step(resumed_main->second, &first); !s.ok()) return s;
      std::optional<Meeting> meeting;
      if (Status s = find_meeting(through_main->second, first, &meeting); !s.ok()) return s;
      uint64_t skip_through = 0;
      if (given && (!meeting || meeting->step != *given)) {
        rp.step = *given;
        rp.found_by = "--resume-step";
      } else if (meeting) {
        rp.step = meeting->step;
        rp.found_by = fmt::format(
            "its first step read {} tensor(s) that run {} read at step {} only ({} first)",
            meeting->tensors, through == 0 ? 'A' : 'B', meeting->step, meeting->op);
        // The ops before that op in its step that both ran in the same order are compared too
        // (the batch's loading); the resumed process's before them are its setup.
        std::vector<std::string> through_names;
        if (Status s = op_names(through_main->second, meeting->step_start, meeting->through_index,
                                &through_names);
            !s.ok())
          return s;
        uint64_t back = 0;
        while (back < through_names.size() && back < meeting->resumed_index &&
               through_names[through_names.size() - 1 - back] ==
                   first.names[meeting->resumed_index - 1 - back])
          ++back;
        rp.setup_ops = meeting->resumed_index - back;
        skip_through = through_names.size() - back;
      } else {
        notes->push_back(fmt::format(
            "{} in run {} looks resumed from a checkpoint, but none of the tensors its first step "
            "read is one run {} read at one step only (parameters not restored?): give the step "
            "it resumed at with --resume-step",
            process, resumed == 0 ? 'A' : 'B', through == 0 ? 'A' : 'B'));
        continue;
      }
      if (rp.step == 0) continue;
      window_resumed_streams(rp, skip_through, selection);
      join_pools(selection, rp);
      set_aside_workers(selection, processes[resumed], processes[through], &rp, notes);
      out->push_back(std::move(rp));
    }
  }
  return Status();
}

void note_resume_step_structure(const std::vector<ResumedProcess>& resumes,
                                const std::vector<StreamResult>& results,
                                std::vector<std::string>* notes) {
  for (const ResumedProcess& rp : resumes)
    for (const StreamResult& res : results) {
      if (!of_process(res.summary.name, rp.process) || res.resume_step_structure_count == 0)
        continue;
      std::map<uint64_t, std::set<std::string>> ops_by_step;
      for (const StructuralDifference& d : res.resume_step_structure)
        for (const std::string* op : {&d.op_a, &d.op_b})
          if (!op->empty()) ops_by_step[d.step].insert(*op);
      std::vector<std::string> where;
      for (const auto& [step, ops] : ops_by_step)
        where.push_back(fmt::format(
            "at step {} ({}), {}", step, fmt::join(ops, ", "),
            step == rp.step
                ? "as in a fresh process's first step (gradients not made yet)"
                : "ops run in its second only (DDP rebuilds its gradient buckets once)"));
      bool values_differ = false;
      for (const auto& [step, n] : res.per_step)
        values_differ |= n > 0 && (step == rp.step || step == rp.step + 1);
      notes->push_back(fmt::format(
          "{}: resumed at step {}, {}'s op sequence differs in {} place(s), {}: not counted; {}",
          res.summary.name, rp.step, rp.process, res.resume_step_structure_count,
          fmt::join(where, "; "),
          values_differ ? "values of those steps differ too"
                        : "every value of those steps agrees"));
    }
}

void note_fresh_layouts(const std::vector<StreamResult>& results, DiffReport* r) {
  for (const StreamResult& res : results) {
    if (res.reordered_at_resume == 0) continue;
    auto rp = std::find_if(r->resumes.begin(), r->resumes.end(), [&](const ResumedProcess& p) {
      return of_process(res.summary.name, p.process);
    });
    if (rp == r->resumes.end()) continue;
    r->notes.push_back(fmt::format(
        "{}: at step {}, the step {} resumed at, {} op(s) held the same values as run {}'s in "
        "another order, {} first: DDP fills its gradient buckets in parameter order in a fresh "
        "process's first iteration, and in the order gradients became ready after it: not "
        "counted as divergent",
        res.summary.name, rp->step, rp->process, res.reordered_at_resume, rp->run == 0 ? 'B' : 'A',
        res.first_reordered));
    rp->reordered_ops += res.reordered_at_resume;
  }
}

void explain_resumes(const StreamSelection& selection, DiffReport* r) {
  for (ResumedProcess& rp : r->resumes) {
    // In one run only, and said here: not an environment difference.
    auto& env = r->environment;
    env.erase(std::remove_if(env.begin(), env.end(),
                             [&](const EnvDifference& d) {
                               return d.key == kProcessPresence &&
                                      (d.process == rp.process ||
                                       std::count(rp.workers.begin(), rp.workers.end(), d.process));
                             }),
              env.end());
    rp.verified = r->verdict == Verdict::kIdentical;
    rp.training_verified = rp.verified || r->training.identical;
    if (r->first && of_process(r->first->stream, rp.process))
      name_what_was_missed(selection, *r, &rp, &*r->first);
  }
}

}  // namespace detaudit
