// Scoped states of a thread's recorder (recorder.h): set for a scope, restored at its end, on
// every path out of it.
#pragma once

#include "stream/stream_writer.h"

namespace detaudit::hooks {

// Holds a stream's buffer (StreamBuffer::enter_write) for a scope and says so in *flag (if
// given); holds nothing when given no buffer, or once the streams are frozen.
class InBuffer {
 public:
  explicit InBuffer(StreamBuffer* stream, bool* flag = nullptr)
      : stream_(stream && stream->enter_write() ? stream : nullptr), flag_(flag) {
    if (stream_ && flag_) *flag_ = true;
  }
  ~InBuffer() {
    if (!stream_) return;
    if (flag_) *flag_ = false;
    stream_->leave_write();
  }
  bool entered() const { return stream_ != nullptr; }
  InBuffer(const InBuffer&) = delete;
  InBuffer& operator=(const InBuffer&) = delete;

 private:
  StreamBuffer* stream_;
  bool* flag_;
};

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
