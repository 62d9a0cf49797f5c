// One thread's records on their way to its stream file: the buffer and the encoders, the
// string table, the records held for digests still on their way (pending_records.h), and the
// hand-overs to the writer thread (stream_writer.h). The op path (hooks/recorder) says what a
// record holds; the sink says where its bytes go and when. Torch-free.
//
// Invariants: only the stream's own op thread calls it, and changes the buffer only inside
// enter() (a stop signal's save reads it from another thread); the buffer holds whole records
// only, up to `committed`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "stream/pending_records.h"
#include "stream/stream_writer.h"
#include "trace/records.h"

namespace detaudit::hooks {

// Digests computed apart from the op's thread (an MD5 batch), which held records wait for: the
// sink hands them on at hand-overs and runs them at the stream's end and at a stop signal's save.
class AsyncDigests {
 public:
  virtual ~AsyncDigests() = default;
  virtual bool empty() const = 0;
  // Hands the batch being filled to the digest thread if it is idle.
  virtual void submit_if_idle() = 0;
  // Runs what is left, on this thread if need be; waits at most `max_wait_ms` (-1: no limit)
  // for the digest thread.
  virtual bool run(long max_wait_ms = -1) = 0;
  // In a forked child: the parent's batch is not this process's.
  virtual void discard() = 0;
};

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

class RecordSink {
 public:
  // `digests`: the thread's batch of digests computed apart, or null; it outlives the sink.
  explicit RecordSink(AsyncDigests* digests = nullptr) : digests_(digests) {}

  // Into the buffer for a scope (StreamBuffer::enter_write): `entered()` is false once the
  // streams are frozen, and with `want` false. inside() says so meanwhile.
  InBuffer enter(bool want = true) { return InBuffer(want ? &stream_ : nullptr, &inside_); }
  bool inside() const { return inside_; }
  StreamBuffer* buffer() { return &stream_; }

  // The stream's file, created by the caller: its header goes to it at once, so that a stream
  // file is never there without one. False when the disk refused it: the file is closed, and
  // the caller's to remove; the stream's records are then dropped.
  bool start(int fd, const trace::StreamHeader& header);
  bool started() const { return started_; }

  // The id of a string in this stream's table; a new one is written before the next record.
  uint32_t intern(std::string_view s);
  // The strings interned since the last call, as STRING records: they must precede the record
  // that names them.
  void write_strings();

  // Where the next record's bytes go: the buffer, or behind a record still held.
  std::string* out() { return held_.sink(&stream_.bytes); }
  trace::RecordEncoder& encoder() { return encoder_; }
  // Ends the record begun on encoder(): framed into out() now, or held until the digests of
  // `holes` (taken, left empty) are in. The strings it named go first.
  void finish_record(std::vector<PendingRecords::Hole>* holes);
  // What the stream counted, for its END record.
  trace::EndInfo& totals() { return totals_; }

  // The records whose digests are in, out of the held ones, committed.
  void release_held();
  bool holding() const { return !held_.empty(); }
  // The buffer's whole records, for the writer and a signal's save.
  void commit() { stream_.committed.store(stream_.bytes.size(), std::memory_order_release); }
  // After each record: hands the buffer over when it is large, or every 50 ms (what a kill -9
  // can lose); the digests computed apart go to their thread then.
  void after_record();

  // At the thread's end, once every digest it waits for is asked for: the END record, and
  // everything handed over. Later records would need a second stream file.
  void end();
  // For a stop signal's save, once the thread is out of its buffer for good: the held records
  // whose digests are in, into the buffer. Waits at most `max_wait_ms` for the digest thread.
  void release_held_for_save(long max_wait_ms = 2000);
  // For the thread a signal stopped, once its whole records are saved up to `saved`: its held
  // records, if it is out of its buffer, released and appended.
  void save_held_after(size_t saved);
  // For a signal's save: the END record naming the signal, when nothing recorded is missing.
  // `open_op`: the op the signal stopped the thread inside, when `stopped` says it is known.
  void close_for_signal(int sig, bool exiting, bool stopped, const std::string& open_op);

  // In a forked child: the parent's stream is not this one.
  void reset_after_fork();

 private:
  StreamBuffer stream_;
  bool started_ = false;
  bool inside_ = false;
  AsyncDigests* digests_;
  trace::RecordEncoder encoder_;         // op and collective records
  trace::RecordEncoder string_encoder_;  // string records, written while an op body is open
  PendingRecords held_;
  std::unordered_map<std::string, uint32_t> strings_;
  std::vector<std::string> pending_strings_;  // interned, not yet written
  trace::EndInfo totals_;
  uint64_t records_since_handover_ = 0;
  uint64_t last_handover_ns_ = 0;
};

}  // namespace detaudit::hooks
