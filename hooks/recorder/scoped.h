// Scoped states of a thread's recorder (recorder.h): set for a scope, restored at its end, on
// every path out of it. (Being inside the stream's buffer is the sink's: InBuffer, record_sink.h.)
#pragma once

namespace detaudit::hooks {

// The recorder runs tensor ops of its own (generator state, device copies) for a scope: their
// callbacks are not the program's ops. Restores what it found, so scopes nest.
class Busy {
 public:
  explicit Busy(bool* busy) : busy_(busy), was_(*busy) { *busy_ = true; }
  ~Busy() { *busy_ = was_; }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;

 private:
  bool* busy_;
  const bool was_;
};

}  // namespace detaudit::hooks
