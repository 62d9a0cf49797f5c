// Streams over a run's traces for `show` and `export` (see summary.h).
#include "summary/summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "run_layout.h"
#include "trace/process_status.h"
#include "trace/run_directory.h"

namespace detaudit::summary {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using trace::ReadResult;
using trace::RecordKind;
using trace::TraceReader;
using trace::Value;
using trace::ValueType;

json header_json(const trace::StreamHeader& h) {
  return {{"version", h.version},
          {"digest", std::string(trace::digest_name(h.algo))},
          {"rank", h.rank},
          {"pid", h.pid},
          {"process_role", h.process_role},
          {"thread", h.thread},
          {"dataloader_worker", (h.flags & trace::kStreamDataLoaderWorker) != 0},
          {"unix_ns", h.unix_ns}};
}

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

json tensor_json(const TraceReader& r, const Value& v) {
  json j = {{"tensor", v.tensor_id}, {"new", v.type == ValueType::kTensorNew}};
  const trace::TensorDesc* t = r.tensor(v.tensor_id);
  if (!t) return j;  // left the reference window; its id still matches its first appearance
  j["dtype"] = std::string(trace::dtype_name(t->dtype));
  j["device"] = t->device_index >= 0
                    ? fmt::format("{}:{}", trace::device_type_name(t->device_type), t->device_index)
                    : std::string(trace::device_type_name(t->device_type));
  j["shape"] = t->sizes.to_vector();
  j["strides"] = t->strides.empty() ? json(nullptr) : json(t->strides.to_vector());
  j["digest"] = t->digest_hex();
  if (t->has_stats()) {
    json stats = {{"min", t->stats.min}, {"max", t->stats.max}, {"mean", t->stats.mean}};
    if (!(t->bits & trace::kTensorIntStats)) stats["l2"] = t->stats.l2;
    j["stats"] = stats;
  } else {
    j["stats"] = nullptr;
  }
  if (t->bits & trace::kTensorHasNanInf) {
    j["nan"] = t->stats.nan;
    j["inf"] = t->stats.inf;
  }
  j["provenance"] = std::string(trace::provenance_name(t->provenance()));
  if (t->base_id >= 0) j["base"] = t->base_id;
  if (t->uninitialized()) j["uninitialized"] = true;
  if (t->not_read()) j["not_read"] = true;
  if (t->sharing != trace::Sharing::kNone)
    j["shared"] = t->sharing == trace::Sharing::kChangedElsewhere ? "changed elsewhere" : "memory";
  return j;
}

// Converts values[*i] (and, for a list, its elements) and advances *i past them.
json value_json(const TraceReader& r, const std::vector<Value>& values, size_t* i) {
  const Value& v = values[(*i)++];
  switch (v.type) {
    case ValueType::kNone: return nullptr;
    case ValueType::kTensorNew:
    case ValueType::kTensorNewShared:  // the reader hands it on as kTensorNew
    case ValueType::kTensorRef: return tensor_json(r, v);
    case ValueType::kTensorWritten: {
      json t = tensor_json(r, v);
      t["written"] = true;  // this op overwrites it without reading it
      return t;
    }
    case ValueType::kTensorSkipped: return {{"skipped", std::string(r.string(uint64_t(v.i)))}};
    case ValueType::kInt: return v.i;
    case ValueType::kDouble: return v.d;
    case ValueType::kBoolFalse: return false;
    case ValueType::kBoolTrue: return true;
    case ValueType::kString: return std::string(r.string(uint64_t(v.i)));
    case ValueType::kDevice:
      return v.i >= 0 ? fmt::format("{}:{}", trace::device_type_name(uint8_t(v.u)), v.i)
                      : std::string(trace::device_type_name(uint8_t(v.u)));
    case ValueType::kGenerator: return {{"generator", hex64(v.u)}};
    case ValueType::kOther: return {{"other", std::string(r.string(uint64_t(v.i)))}};
    case ValueType::kIntList:
    case ValueType::kDoubleList:
    case ValueType::kBoolList:
    case ValueType::kList: {
      json list = json::array();
      for (uint64_t k = 0; k < v.count && *i < values.size(); ++k)
        list.push_back(value_json(r, values, i));
      return list;
    }
  }
  return nullptr;
}

json step_json(const trace::StepInfo& s) {
  return {{"step", s.step},
          {"order", s.order},
          {"rng_cpu", hex64(s.rng_cpu)},
          {"rng_cuda", hex64(s.rng_cuda)},
          {"rng_numpy", hex64(s.rng_numpy)},
          {"rng_python", hex64(s.rng_python)},
          {"intra_op_threads", s.intra_op_threads},
          {"determinism_bits", s.determinism_bits}};
}

json op_json(const TraceReader& r) {
  const trace::OpRecord& op = r.op();
  json j = {{"offset", op.offset},
            {"order", op.order},
            {"step", op.step},
            {"name", std::string(r.string(op.name))},
            {"phase", std::string(trace::phase_name(op.phase))},
            {"scope", std::string(trace::scope_name(op.scope))},
            {"depth", op.depth},
            {"scope_path",
             op.scope_path < UINT32_MAX ? json(std::string(r.string(op.scope_path))) : json("")},
            {"seq_nr", op.has_seq_nr() ? json(op.seq_nr) : json(nullptr)},
            {"rng", op.has_rng() ? json(hex64(op.rng)) : json(nullptr)},
            {"random", op.is_random()},
            {"compiled_region", (op.bits & trace::kOpCompiledRegion) != 0}};
  j["inputs"] = values_to_json(r, op.inputs);
  const auto returned = op.outputs.begin() + std::ptrdiff_t(op.returned_values);
  j["outputs"] = values_to_json(r, std::vector<Value>(op.outputs.begin(), returned));
  if (!op.written_args.empty()) {
    // The written section: each argument the op wrote and did not return, as it ended.
    json written = json::object();
    size_t i = 0;
    const std::vector<Value> values(returned, op.outputs.end());
    for (const trace::OpRecord::WrittenArg& arg : op.written_args)
      written[std::string(r.string(arg.name))] = value_json(r, values, &i);
    j["written"] = std::move(written);
  }
  return j;
}

Status corrupt(const TraceReader& r) { return Status::error(r.error(), ExitCode::kBadInput); }

}  // namespace

json values_to_json(const TraceReader& r, const std::vector<Value>& values) {
  json out = json::array();
  size_t i = 0;
  while (i < values.size()) out.push_back(value_json(r, values, &i));
  return out;
}

Status find_streams(const std::string& run_dir, const std::string& stream,
                    std::vector<std::pair<std::string, std::string>>* out) {
  out->clear();
  trace::RunDirectory run;
  if (Status s = trace::RunDirectory::open(run_dir, &run); !s.ok()) return s;
  if (stream.empty()) {
    for (const trace::RunFile& f : run.traces()) out->emplace_back(f.name, f.path);
    return Status();
  }
  std::string want = stream;
  if (fs::path(want).extension() == layout::kTraceExt) want = fs::path(want).stem().string();
  if (const trace::RunFile* f = run.trace(want)) {
    out->emplace_back(f->name, f->path);
    return Status();
  }
  std::string known;
  for (const trace::RunFile& f : run.traces()) known += (known.empty() ? "" : ", ") + f.name;
  return Status::error(fmt::format("{}: no stream named {} (streams: {})", run_dir, stream,
                                   known.empty() ? "none" : known));
}

Status summarize_run(const std::string& run_dir, const std::string& stream, RunSummary* out) {
  *out = RunSummary{};
  out->dir = run_dir;
  std::vector<std::pair<std::string, std::string>> files;
  if (Status s = find_streams(run_dir, stream, &files); !s.ok()) return s;

  std::ifstream run_json(fs::path(run_dir) / layout::kRunJson);
  if (run_json) {
    json j = json::parse(run_json, nullptr, false);
    out->run_json = j.is_discarded() ? json(nullptr) : j;
  }
  for (const trace::RunFile& f : trace::RunDirectory::list(run_dir).statuses()) {
    std::ifstream in(f.path);
    std::string line;
    std::getline(in, line);
    out->statuses.emplace_back(f.name, line);
  }

  for (const auto& [name, path] : files) {
    StreamSummary s;
    s.name = name;
    s.path = path;
    TraceReader r;
    if (Status st = r.open(path); !st.ok()) return st;
    s.header = r.header();
    s.bytes = r.file_size();
    // Names are counted by string id and resolved at the end: no string copy per op.
    std::vector<uint64_t> by_id;
    ReadResult res;
    while ((res = r.next()) == ReadResult::kRecord) {
      switch (r.kind()) {
        case RecordKind::kOp: {
          const trace::OpRecord& op = r.op();
          ++s.ops;
          ++s.phase_ops[size_t(op.phase) & 3];
          if (op.name >= by_id.size()) by_id.resize(op.name + 1);
          ++by_id[op.name];
          break;
        }
        case RecordKind::kStep:
          if (s.step_records == 0) s.first_step = r.step().step;
          s.last_step = std::max(s.last_step, r.step().step);
          ++s.step_records;
          break;
        default: break;
      }
    }
    if (res == ReadResult::kCorrupt) return corrupt(r);
    for (size_t id = 0; id < by_id.size(); ++id)
      if (by_id[id]) s.op_counts[std::string(r.string(id))] += by_id[id];
    s.saw_end = r.saw_end();
    s.end = r.end_info();
    s.cut_short = !s.saw_end;
    if (res == ReadResult::kTruncated) s.cut_reason = r.error();
    out->streams.push_back(std::move(s));
  }
  return Status();
}

std::vector<std::pair<std::string, uint64_t>> top_ops(const RunSummary& s, size_t n) {
  std::map<std::string, uint64_t> all;
  for (const auto& stream : s.streams)
    for (const auto& [name, count] : stream.op_counts) all[name] += count;
  std::vector<std::pair<std::string, uint64_t>> v(all.begin(), all.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (v.size() > n) v.resize(n);
  return v;
}

Status for_each_step_op(const std::string& trace_path, uint64_t step,
                        const std::function<void(const OpLine&)>& fn) {
  TraceReader r;
  if (Status s = r.open(trace_path); !s.ok()) return s;
  ReadResult res;
  bool seen = false;
  while ((res = r.next()) == ReadResult::kRecord) {
    if (r.kind() != RecordKind::kOp) continue;
    const trace::OpRecord& op = r.op();
    if (op.step != step) {
      if (seen && op.step > step) break;  // steps only go forward within a stream
      continue;
    }
    seen = true;
    OpLine line;
    line.order = op.order;
    line.depth = op.depth;
    line.name = std::string(r.string(op.name));
    line.phase = op.phase;
    if (!op.output_tensors.empty())
      if (const trace::TensorDesc* t = r.tensor(op.output_tensors[0])) {
        line.digest_prefix = t->digest_hex().substr(0, 12);
        line.shape = t->sizes.to_vector();
      }
    fn(line);
  }
  if (res == ReadResult::kCorrupt) return corrupt(r);
  return Status();
}

Status export_run(const std::string& run_dir, const std::string& stream, std::ostream& out,
                  std::vector<std::string>* notes) {
  std::vector<std::pair<std::string, std::string>> files;
  if (Status s = find_streams(run_dir, stream, &files); !s.ok()) return s;
  for (const auto& [name, path] : files) {
    TraceReader r;
    if (Status s = r.open(path); !s.ok()) return s;
    json h = header_json(r.header());
    h["record"] = "header";
    h["stream"] = name;
    out << h.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
    ReadResult res;
    while ((res = r.next()) == ReadResult::kRecord) {
      json j;
      switch (r.kind()) {
        case RecordKind::kStep:
          j = step_json(r.step());
          j["record"] = "step";
          break;
        case RecordKind::kOp:
          j = op_json(r);
          j["record"] = "op";
          break;
        case RecordKind::kCollective: {
          const trace::CollectiveRecord& c = r.collective();
          j = {{"record", "collective"},
               {"order", c.info.op_order},
               {"group", c.info.group},
               {"seq", c.info.seq},
               {"group_rank", c.info.group_rank},
               {"group_size", c.info.group_size},
               {"completed", c.info.state == trace::kCollectiveCompleted},
               {"failed", c.info.state == trace::kCollectiveFailed},
               {"received", values_to_json(r, c.values)}};
          break;
        }
        case RecordKind::kEnd:
          j = {{"record", "end"},
               {"ops", r.end_info().ops},
               {"tensors_hashed", r.end_info().tensors_hashed},
               {"bytes_hashed", r.end_info().bytes_hashed}};
          if (const trace::EndInfo& e = r.end_info(); e.signal != 0) {
            // A crash ended the stream (format 7): by which signal, and inside which op.
            j["signal"] = trace::signal_text(e.signal);
            j["while_exiting"] = (e.ending_bits & trace::kEndExiting) != 0;
            j["inside_op"] = e.ending_bits & trace::kEndInsideOp ? json(e.open_op) : json(nullptr);
          }
          break;
        default: continue;  // strings are resolved inline
      }
      j["stream"] = name;
      // Invalid UTF-8 in an op name must not abort the export: replace it.
      out << j.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
    }
    if (res == ReadResult::kCorrupt) {
      out.flush();
      return corrupt(r);
    }
    if (res == ReadResult::kTruncated)
      notes->push_back(fmt::format("{}: cut short (the program was killed?): {}", name, r.error()));
    else if (!r.saw_end())
      notes->push_back(
          fmt::format("{}: no END record: the program ended without closing it", name));
  }
  return Status();
}

}  // namespace detaudit::summary
