// Raw digest throughput on this machine, the floor the recorder is measured against: each
// algorithm over a cache-resident 1 MiB buffer, and MB/s of statistics alone. Also what bounds
// large tensors: XXH3 and memcpy over 128 MiB, and MD5 leaves (16 at a time in vector lanes where
// the CPU has AVX-512) on two threads against one.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "digest/digest.h"
#include "digest/md5_lanes.h"

int main() {
  using namespace detaudit;
  std::vector<float> data(1 << 18);
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i % 1000) * 0.001f;
  const size_t bytes = data.size() * sizeof(float);
  auto mbps = [](size_t n, auto&& fn) {
    int reps = 0;
    auto t0 = std::chrono::steady_clock::now();
    double s = 0;
    do {
      fn();
      ++reps;
      s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (s < 0.3);
    return double(n) * reps / s / 1e6;
  };
  std::printf("{");
  for (auto algo :
       {trace::DigestAlgo::kMd5, trace::DigestAlgo::kSha256, trace::DigestAlgo::kXxh3}) {
    Hasher h(algo);
    uint8_t out[32];
    double v = mbps(bytes, [&] {
      h.reset();
      h.update(data.data(), bytes);
      h.finish(out);
    });
    std::printf("\"%s\": %.0f, ", std::string(trace::digest_name(algo)).c_str(), v);
  }
  if (Md5Lanes::available()) {  // the same 1 MiB as 16 lanes of 64 KiB: large tensors' leaves
    const uint8_t* lane[Md5Lanes::kLanes];
    for (size_t l = 0; l < Md5Lanes::kLanes; ++l)
      lane[l] = reinterpret_cast<const uint8_t*>(data.data()) + l * (bytes / Md5Lanes::kLanes);
    uint8_t out[Md5Lanes::kLanes][16];
    double v = mbps(bytes, [&] {
      Md5Lanes m;
      m.update(lane, bytes / Md5Lanes::kLanes);
      m.finish(bytes / Md5Lanes::kLanes, out);
    });
    std::printf("\"md5_16_lanes\": %.0f, ", v);
  }
  double stats = mbps(bytes, [&] {
    StatsAccumulator a(trace::Dtype::kFloat32);
    a.update(data.data(), bytes);
    (void)a.finish();
  });
  std::printf("\"stats\": %.0f, ", stats);

  // The device digest's CPU reference, and what its leaf size costs: a leaf's fold (31 rounds and
  // an avalanche, one after another) against its words' rounds (32 lanes side by side).
  for (bool with_stats : {false, true}) {
    double v = mbps(bytes, [&] {
      DeviceDigester d(trace::Dtype::kFloat32, with_stats);
      d.update(data.data(), bytes);
      (void)d.finish();
    });
    std::printf("\"%s\": %.0f, ", with_stats ? "device_with_stats" : "device", v);
  }
  {
    uint64_t acc[lanes::kLanes];
    for (uint32_t l = 0; l < lanes::kLanes; ++l) acc[l] = lanes::lane_seed(0, l);
    const auto* words = reinterpret_cast<const uint64_t*>(data.data());
    const size_t rows = bytes / (8 * lanes::kLanes);
    const double row_mbps = mbps(bytes, [&] {
      for (size_t r = 0; r < rows; ++r)
        for (uint32_t l = 0; l < lanes::kLanes; ++l)
          acc[l] = lanes::xxh64_round(acc[l], words[r * lanes::kLanes + l]);
    });
    uint64_t folded = acc[0];
    const size_t folds = 1 << 16;
    const double fold_mbps = mbps(folds * 8, [&] {
      for (size_t f = 0; f < folds; ++f) {
        uint64_t v[lanes::kLanes];
        for (uint32_t l = 0; l < lanes::kLanes; ++l) v[l] = acc[l] ^ folded;
        for (uint32_t w = lanes::kLanes / 2; w >= 1; w /= 2)
          for (uint32_t l = 0; l < w; ++l) v[l] = lanes::fold_hash(v[l], v[l + w]);
        folded = lanes::leaf_hash(v[0], lanes::kLeafWords);
      }
    });
    const double row_ns = 256 / row_mbps * 1e3, fold_ns = 8 / fold_mbps * 1e3;
    std::printf(
        "\"device_row_ns\": %.2f, \"device_fold_ns\": %.2f, \"device_fold_share_1k\": %.3f, "
        "\"device_fold_share_4k\": %.3f, \"device_fold_share_16k\": %.3f, \"device_sink\": %llu, ",
        row_ns, fold_ns, fold_ns / (4 * row_ns), fold_ns / (16 * row_ns), fold_ns / (64 * row_ns),
        (unsigned long long)(folded & 1));
  }

  // 8 tensors of 16 MiB, as a CNN's activations: read from memory, not from cache.
  std::vector<std::vector<uint8_t>> cold(8, std::vector<uint8_t>(16 << 20, 1));
  const size_t cold_bytes = cold.size() * cold[0].size();
  ParallelFor one = [](size_t n, const std::function<void(size_t, size_t)>& fn) { fn(0, n); };
  // Two threads, each digesting its half of the tensors: a tensor of 16 leaves is one lane pass,
  // which one thread runs, so two threads can only be busy on two tensors at once.
  auto digest_all = [&](trace::DigestAlgo algo, size_t threads) {
    auto digest = [&](size_t from, size_t to) {
      Hasher h(algo);
      for (size_t i = from; i < to; ++i) {
        TensorDigester d(&h, trace::Dtype::kUInt8, false);
        d.update_all(cold[i].data(), cold[i].size(), one);
        trace::TensorDesc out;
        d.finish(&out);
      }
    };
    return mbps(cold_bytes, [&] {
      if (threads == 1) return digest(0, cold.size());
      std::thread other([&] { digest(cold.size() / 2, cold.size()); });
      digest(0, cold.size() / 2);
      other.join();
    });
  };
  std::vector<uint8_t> sink(cold[0].size());
  double copy = mbps(cold_bytes, [&] {
    for (auto& t : cold) std::memcpy(sink.data(), t.data(), t.size());
  });
  std::printf("\"xxh3_cold\": %.0f, \"memcpy_cold\": %.0f, ",
              digest_all(trace::DigestAlgo::kXxh3, 1), copy);
  std::printf("\"md5_cold_1_thread\": %.0f, \"md5_cold_2_threads\": %.0f}\n",
              digest_all(trace::DigestAlgo::kMd5, 1), digest_all(trace::DigestAlgo::kMd5, 2));
}
