// A difference is a divergence once the program reads it. The comparator keeps each candidate
// first divergence open with the tensor versions that differ, one set per run, until a later
// op reads one (confirmed) or every one is overwritten in full first (no op ever saw it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trace/reader.h"

namespace detaudit {

class DifferingVersions {
 public:
  void add(int64_t id);
  // An enclosing op's output: where it holds the same bytes as one of them under a new id
  // (a backend kernel's output hashed again), it replaces it, as later ops refer to the newest.
  void add_enclosing_output(int64_t id, const trace::TraceReader& r);
  bool empty() const { return ids_.empty(); }
  // Input i is one of them, or a view of one, and the op reads it (does not overwrite it).
  bool read_at(const trace::OpRecord& op, size_t i, const trace::TraceReader& r) const;
  // t holds the same bytes as one of them: an alias the recorder could not link (a C++
  // program's p.grad() seen as a new, external tensor).
  bool same_bytes_as_one(const trace::TensorDesc& t, const trace::TraceReader& r) const;
  // Forgets those the op writes in full without reading: an input TENSOR_WRITTEN, or NOT_READ
  // (an in-place op that overwrites it, a receive buffer), that is one of them or a view of one
  // with as many elements. True if any.
  bool forget_written(const trace::OpRecord& op, const trace::TraceReader& r);
  // The oldest can still be referenced: a later read of it would show as a reference.
  bool in_reach(const trace::TraceReader& r) const;

 private:
  bool contains(int64_t id) const;
  std::vector<int64_t> ids_;  // a few: an op's differing outputs
};

}  // namespace detaudit
