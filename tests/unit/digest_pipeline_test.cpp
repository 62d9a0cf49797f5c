// The device digest's pipeline on the CPU: a fake device queue whose completions the test
// controls (late, out of order, a full ring, a drain while digests are pending, as at SIGTERM),
// and the held records it completes. Records must come out whole, in program order, each tensor
// with the digest of its bytes as they were when its op ended, and nothing lost.
#include "device/digest_pipeline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "digest/device_digest.h"
#include "stream/pending_records.h"
#include "trace/bytes.h"
#include "trace/reader.h"
#include "trace/records.h"

namespace detaudit {
namespace {

using device::DigestJob;
using hooks::PendingRecords;
using lanes::LaneResult;

// Reads the bytes when the batch is enqueued, as the kernel does on the op's stream; says it is
// done only when the test (or its completer thread) completes the slot.
class FakeQueue : public device::DeviceQueue {
 public:
  explicit FakeQueue(int slots) : results_(size_t(slots)), done_(size_t(slots), true) {}
  int slots() const override { return int(results_.size()); }
  bool enqueue(const DigestJob* jobs, int n, void* stream, int slot) override {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_TRUE(done_[size_t(slot)]) << "slot " << slot << " reused before its batch completed";
    results_[size_t(slot)].clear();
    for (int j = 0; j < n; ++j) {
      DeviceDigester d(jobs[j].dtype);
      d.update(jobs[j].data, jobs[j].bytes);
      results_[size_t(slot)].push_back(d.finish());
    }
    done_[size_t(slot)] = false;
    pending_.push_back(slot);
    return true;
  }
  bool wait(int slot) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_[size_t(slot)]; });
    return !failing_;
  }
  void fail_from_now() { failing_ = true; }
  const LaneResult* results(int slot) override { return results_[size_t(slot)].data(); }

  // Completes one pending slot, chosen by `pick` among them; false if none is pending.
  bool complete_one(std::mt19937* rng) {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.empty()) return false;
    const size_t i = rng ? (*rng)() % pending_.size() : 0;
    done_[size_t(pending_[i])] = true;
    pending_.erase(pending_.begin() + long(i));
    cv_.notify_all();
    return true;
  }
  size_t pending() {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<LaneResult>> results_;
  std::vector<bool> done_;
  std::vector<int> pending_;
  std::atomic<bool> failing_{false};
};

// An OP record's kind and body up to its one output's <tensor>: the next op, "aten::add", no
// inputs, a TENSOR_NEW to follow.
std::string op_with_one_output() {
  std::string body(1, char(trace::RecordKind::kOp));
  trace::ByteWriter w(&body);
  w.zvarint(1);  // order delta
  w.varint(0);   // name: "aten::add"
  w.u8(0);       // op bits
  w.varint(0);   // depth
  w.varint(0);   // no inputs
  w.varint(1);
  w.u8(uint8_t(trace::ValueType::kTensorNew));
  return body;
}

// One op thread's stream: OP records with one output tensor each, digested on the "device"
// (held until the digest comes back) or on the host (written at once).
struct Program {
  std::string stream;
  PendingRecords held;
  trace::RecordEncoder encoder;
  std::deque<std::vector<float>> buffers;   // the "device memory", reused by later ops
  std::vector<trace::TensorDesc> expected;  // per op, in program order

  void header() {
    trace::StreamHeader h;
    h.algo = trace::DigestAlgo::kDevice;
    encoder.header(h, held.sink(&stream));
    encoder.string("aten::add", held.sink(&stream));
  }

  void op(device::DigestPipeline* pipeline, size_t n, bool on_device, std::mt19937* rng) {
    std::vector<float> data(n);
    for (float& x : data) x = float((*rng)() % 1000) * 0.5f - 100.f;
    trace::TensorDesc desc;
    desc.dtype = trace::Dtype::kFloat32;
    desc.device_type = on_device ? 1 : 0;
    desc.device_index = on_device ? 0 : -1;
    desc.bits = trace::kTensorContiguous;
    desc.sizes.resize(1);
    desc.sizes[0] = int64_t(n);
    DeviceDigester ref(trace::Dtype::kFloat32);
    ref.update(data.data(), n * 4);
    trace::TensorDesc want = desc;
    lane_result_to_desc(ref.finish(), trace::Dtype::kFloat32, true, &want);
    expected.push_back(want);

    std::string body = op_with_one_output();
    if (!on_device) {
      trace::ByteWriter w(&body);
      trace::write_tensor(w, want, 0);
      held.hold(std::move(body), {});
      return;
    }
    auto digest = std::make_shared<hooks::PendingDigest>(trace::Dtype::kFloat32, true);
    PendingRecords::Hole hole;
    hole.offset = body.size();
    hole.desc = desc;
    hole.digest = digest;
    std::vector<PendingRecords::Hole> holes;
    holes.push_back(std::move(hole));
    held.hold(std::move(body), std::move(holes));
    buffers.push_back(std::move(data));
    pipeline->submit({DigestJob{buffers.back().data(), n * 4, trace::Dtype::kFloat32}},
                     /*stream=*/nullptr, [digest](const LaneResult* r, int count) {
                       ASSERT_EQ(count, 1);
                       ASSERT_NE(r, nullptr);
                       digest->complete(r);
                     });
    // The program writes the memory again at once (the next op reuses it): the digest must be
    // of the bytes at the op's end.
    std::fill(buffers.back().begin(), buffers.back().end(), -1.f);
    if (buffers.size() > 8) buffers.pop_front();
  }

  // Reads the stream back: every OP record whole, in order, with the digest of its bytes.
  void check(const std::string& what) {
    const std::string path = ::testing::TempDir() + "/pipeline_" + what + "_" +
                             std::to_string(::getpid()) + ".dtr";
    std::ofstream(path, std::ios::binary) << stream;
    trace::TraceReader r;
    ASSERT_TRUE(r.open(path).ok()) << what;
    size_t ops = 0;
    uint64_t last_order = 0;
    trace::ReadResult res;
    while ((res = r.next()) == trace::ReadResult::kRecord) {
      if (r.kind() != trace::RecordKind::kOp) continue;
      const trace::OpRecord& op = r.op();
      EXPECT_EQ(op.order, last_order + 1) << what << ": out of program order";
      last_order = op.order;
      ASSERT_EQ(op.output_tensors.size(), 1u);
      const trace::TensorDesc* t = r.tensor(op.output_tensors[0]);
      ASSERT_NE(t, nullptr);
      ASSERT_LT(ops, expected.size());
      EXPECT_TRUE(t->same_digest(expected[ops])) << what << ": op " << ops;
      EXPECT_EQ(t->stats.mean, expected[ops].stats.mean) << what << ": op " << ops;
      EXPECT_EQ(t->device_type, expected[ops].device_type);
      ++ops;
    }
    EXPECT_EQ(res, trace::ReadResult::kEof) << what << ": " << r.error();
    EXPECT_EQ(ops, expected.size()) << what << ": records lost";
    std::remove(path.c_str());
  }
};

TEST(DigestPipelineTest, LateOutOfOrderCompletionsKeepProgramOrder) {
  FakeQueue queue(8);
  device::DigestPipeline pipeline(&queue);
  std::atomic<bool> stop{false};
  std::thread completer([&] {  // completes pending slots in random order, late
    std::mt19937 rng(1);
    while (!stop.load()) {
      if (!queue.complete_one(&rng)) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
    }
    while (queue.complete_one(nullptr)) {
    }
  });
  Program p;
  p.header();
  std::mt19937 rng(2);
  size_t released_early = 0;
  for (int i = 0; i < 300; ++i) {
    p.op(&pipeline, 1 + rng() % 3000, /*on_device=*/i % 5 != 0, &rng);
    released_early += p.held.release(&p.stream);  // at each op's end, as the recorder will
  }
  pipeline.drain();
  stop.store(true);
  completer.join();
  p.held.release(&p.stream);
  EXPECT_TRUE(p.held.empty());
  EXPECT_GT(released_early, 0u) << "records are released while the program runs, not at its end";
  p.check("out_of_order");
}

TEST(DigestPipelineTest, AFullRingWaitsForTheOldestAndLosesNothing) {
  FakeQueue queue(2);
  device::DigestPipeline pipeline(&queue);
  Program p;
  p.header();
  std::mt19937 rng(3);
  std::atomic<bool> stop{false};
  std::thread completer([&] {  // slow: the ring fills
    while (!stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      queue.complete_one(nullptr);
    }
    while (queue.complete_one(nullptr)) {
    }
  });
  for (int i = 0; i < 40; ++i) {
    p.op(&pipeline, 100 + rng() % 5000, true, &rng);
    p.held.release(&p.stream);
    EXPECT_LE(queue.pending(), 2u);
  }
  pipeline.drain();
  stop.store(true);
  completer.join();
  p.held.release(&p.stream);
  EXPECT_GT(pipeline.ring_full_waits(), 0u);
  EXPECT_EQ(pipeline.batches(), 40u);
  p.check("full_ring");
}

// SIGTERM and exit drain the pending digests before the stream is saved: drain() returns only
// once every batch submitted has completed, however late, and then every record is released.
TEST(DigestPipelineTest, DrainWhileDigestsArePendingWritesEveryRecord) {
  FakeQueue queue(16);
  device::DigestPipeline pipeline(&queue);
  Program p;
  p.header();
  std::mt19937 rng(4);
  for (int i = 0; i < 12; ++i) p.op(&pipeline, 10 + rng() % 9000, true, &rng);
  EXPECT_EQ(p.held.release(&p.stream), 0u) << "nothing completed yet";
  std::atomic<bool> drained{false};
  std::thread stop_signal([&] {
    pipeline.drain();
    drained.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(drained.load()) << "drain returned with digests pending";
  std::mt19937 order(5);
  while (queue.complete_one(&order)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  stop_signal.join();
  EXPECT_TRUE(drained.load());
  EXPECT_EQ(p.held.release(&p.stream), 12u);
  p.check("drain");
}

// A stop signal's handler may interrupt a thread inside submit(), holding the pipeline's lock:
// its drain gives up after its time instead of waiting forever, and succeeds once all completed.
TEST(DigestPipelineTest, ASignalHandlersDrainNeverBlocks) {
  FakeQueue queue(4);
  device::DigestPipeline pipeline(&queue);
  Program p;
  p.header();
  std::mt19937 rng(6);
  for (int i = 0; i < 3; ++i) p.op(&pipeline, 100, true, &rng);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(pipeline.drain_for(30)) << "digests are pending";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  while (queue.complete_one(nullptr)) {
  }
  EXPECT_TRUE(pipeline.drain_for(2000));
  EXPECT_EQ(p.held.release(&p.stream), 3u);
  p.check("drain_for");
}

// A signal's save launches the open batches without ever blocking: on a full ring it gives up,
// nothing enqueued and its completion not called; once a slot frees, it goes.
TEST(DigestPipelineTest, ASignalsSubmitGivesUpOnAFullRingAndLosesNothing) {
  FakeQueue queue(2);
  device::DigestPipeline pipeline(&queue);
  Program p;
  p.header();
  std::mt19937 rng(7);
  for (int i = 0; i < 2; ++i) p.op(&pipeline, 100, true, &rng);  // both slots busy
  std::vector<uint8_t> bytes(64, 7);
  const std::vector<DigestJob> jobs = {{bytes.data(), bytes.size(), trace::Dtype::kUInt8}};
  int called = 0;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(pipeline.submit_within(
      jobs, nullptr, [&](const LaneResult*, int) { ++called; }, 20));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(pipeline.batches(), 2u);
  ASSERT_TRUE(queue.complete_one(nullptr));
  EXPECT_TRUE(pipeline.submit_within(
      jobs, nullptr,
      [&](const LaneResult* r, int n) {
        EXPECT_NE(r, nullptr);
        EXPECT_EQ(n, 1);
        ++called;
      },
      2000));
  while (queue.complete_one(nullptr)) {
  }
  pipeline.drain();
  EXPECT_EQ(called, 1);
  EXPECT_EQ(p.held.release(&p.stream), 2u);
  p.check("submit_within");
}

// A batch the device could not digest still releases its records, whole and in order, with the
// tensor described by its geometry as not read: nothing uncomputed is compared.
TEST(DigestPipelineTest, AFailedBatchLeavesRecordsWholeAndMarksItsTensorsNotRead) {
  FakeQueue queue(4);
  queue.fail_from_now();
  device::DigestPipeline pipeline(&queue);
  std::string stream;
  PendingRecords held;
  trace::RecordEncoder encoder;
  trace::StreamHeader h;
  h.algo = trace::DigestAlgo::kDevice;
  encoder.header(h, held.sink(&stream));
  encoder.string("aten::add", held.sink(&stream));
  std::vector<float> data(64, 1.f);
  // Two records name the same tensor version: one digest, two holes.
  auto digest = std::make_shared<hooks::PendingDigest>(trace::Dtype::kFloat32, true);
  for (int op = 0; op < 2; ++op) {
    std::string body = op_with_one_output();
    PendingRecords::Hole hole;
    hole.offset = body.size();
    hole.desc.dtype = trace::Dtype::kFloat32;
    hole.desc.device_type = 1;
    hole.desc.device_index = 0;
    hole.desc.bits = trace::kTensorContiguous;
    hole.desc.digest_len = 8;
    hole.desc.sizes.resize(1);
    hole.desc.sizes[0] = 64;
    hole.digest = digest;
    std::vector<PendingRecords::Hole> holes;
    holes.push_back(std::move(hole));
    held.hold(std::move(body), std::move(holes));
  }
  pipeline.submit({DigestJob{data.data(), 256, trace::Dtype::kFloat32}}, nullptr,
                  [digest](const LaneResult* r, int) { digest->complete(r); });
  while (queue.complete_one(nullptr)) {
  }
  pipeline.drain();
  EXPECT_TRUE(digest->failed());
  EXPECT_EQ(held.release(&stream), 2u);
  const std::string path = ::testing::TempDir() + "/pipeline_failed_" + std::to_string(::getpid()) +
                           ".dtr";
  std::ofstream(path, std::ios::binary) << stream;
  trace::TraceReader r;
  ASSERT_TRUE(r.open(path).ok());
  size_t ops = 0;
  while (r.next() == trace::ReadResult::kRecord) {
    if (r.kind() != trace::RecordKind::kOp) continue;
    const trace::TensorDesc* t = r.tensor(r.op().output_tensors[0]);
    ASSERT_NE(t, nullptr);
    EXPECT_TRUE(t->not_read());
    EXPECT_FALSE(t->has_contents());
    EXPECT_EQ(t->numel(), 64u);
    ++ops;
  }
  EXPECT_EQ(ops, 2u);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace detaudit
