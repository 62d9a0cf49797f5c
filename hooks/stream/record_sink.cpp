#include "stream/record_sink.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

namespace detaudit::hooks {
namespace {

constexpr size_t kHandoverBytes = 256 * 1024;
constexpr size_t kStreamReserve = 4 * kHandoverBytes;
constexpr uint64_t kHandoverNs = 50'000'000;  // bounds what a kill -9 can lose

uint64_t now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

}  // namespace

bool RecordSink::start(int fd, const trace::StreamHeader& header) {
  stream_.fd = fd;
  started_ = true;
  // Room for a handover's bytes, taken now: when the buffer grows must not depend on timing.
  stream_.bytes.reserve(kStreamReserve);
  StreamWriter::instance().start();
  std::string bytes;
  encoder_.header(header, &bytes);
  bool written = true;
  if (stream_.fd >= 0 && !write_fully(stream_.fd, bytes.data(), bytes.size())) {
    const int err = errno;
    ::close(stream_.fd);
    stream_.fd = -1;
    errno = err;
    written = false;
  }
  commit();
  last_handover_ns_ = now_ns();
  return written;
}

uint32_t RecordSink::intern(std::string_view s) {
  auto it = strings_.find(std::string(s));
  if (it != strings_.end()) return it->second;
  uint32_t id = uint32_t(strings_.size());
  strings_.emplace(std::string(s), id);
  pending_strings_.emplace_back(s);
  return id;
}

void RecordSink::write_strings() {
  for (const std::string& s : pending_strings_) string_encoder_.string(s, out());
  pending_strings_.clear();
}

void RecordSink::finish_record(std::vector<PendingRecords::Hole>* holes) {
  write_strings();
  if (holes->empty()) {
    encoder_.finish(out());
  } else {
    held_.hold(encoder_.scratch(), std::move(*holes));
    holes->clear();
  }
}

void RecordSink::release_held() {
  if (!held_.empty() && held_.release(&stream_.bytes)) commit();
}

void RecordSink::after_record() {
  const bool big = stream_.bytes.size() >= kHandoverBytes;
  if (big || (++records_since_handover_ & 7) == 0) {
    uint64_t now = now_ns();
    if (big || now - last_handover_ns_ >= kHandoverNs) {
      // What waits for the digests goes with a later hand-over.
      if (digests_ && !digests_->empty()) {
        digests_->submit_if_idle();
        release_held();
      }
      StreamWriter::instance().hand_over(&stream_);
      last_handover_ns_ = now;
    }
  }
}

void RecordSink::end() {
  release_held();
  encoder_.end(totals_, out());
  commit();
  StreamWriter::instance().hand_over(&stream_);
  started_ = false;
}

void RecordSink::release_held_for_save(long max_wait_ms) {
  // Bounded: the digest thread may be starved, and the process is about to end.
  if (digests_) digests_->run(std::min(max_wait_ms, 2000L));
  release_held();
}

void RecordSink::save_held_after(size_t saved) {
  if (stream_.writing.load()) return;
  release_held_for_save();
  StreamWriter::instance().crash_flush(&stream_, saved);
}

void RecordSink::close_for_signal(int sig, bool exiting, bool stopped, const std::string& open_op) {
  // A record still waiting for a digest, or one being written, would be missing behind the END.
  if (!started_ || stream_.fd < 0 || stream_.writing.load() || !held_.empty()) return;
  trace::EndInfo end = totals_;
  end.signal = sig;
  end.ending_bits = exiting ? trace::kEndExiting : 0;
  if (stopped) {
    end.ending_bits |= trace::kEndThreadKnown;
    end.open_op = open_op;
    if (!end.open_op.empty()) end.ending_bits |= trace::kEndInsideOp;
  }
  char buf[trace::kMaxEndRecordBytes];
  StreamWriter::instance().append_now(&stream_, buf, trace::encode_end(end, buf));
}

void RecordSink::reset_after_fork() {
  stream_.fd = -1;
  stream_.bytes.clear();
  stream_.committed.store(0);
  stream_.deferred_signal.store(0);
  held_ = PendingRecords();
  if (digests_) digests_->discard();
  started_ = false;
  strings_.clear();
  pending_strings_.clear();
  totals_ = {};
}

}  // namespace detaudit::hooks
