// Raw digest throughput on this machine, the floor the recorder is measured against: each
// algorithm over a cache-resident 1 MiB buffer, and MB/s of statistics alone.
#include <chrono>
#include <cstdio>
#include <vector>

#include "digest/digest.h"

int main() {
  using namespace detaudit;
  std::vector<float> data(1 << 18);
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i % 1000) * 0.001f;
  const size_t bytes = data.size() * sizeof(float);
  auto mbps = [&](auto&& fn) {
    int reps = 0;
    auto t0 = std::chrono::steady_clock::now();
    double s = 0;
    do {
      fn();
      ++reps;
      s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (s < 0.3);
    return double(bytes) * reps / s / 1e6;
  };
  std::printf("{");
  for (auto algo : {trace::DigestAlgo::kMd5, trace::DigestAlgo::kSha256, trace::DigestAlgo::kXxh3}) {
    Hasher h(algo);
    uint8_t out[32];
    double v = mbps([&] { h.reset(); h.update(data.data(), bytes); h.finish(out); });
    std::printf("\"%s\": %.0f, ", std::string(trace::digest_name(algo)).c_str(), v);
  }
  double stats = mbps([&] { StatsAccumulator a(6); a.update(data.data(), bytes); (void)a.finish(); });
  std::printf("\"stats\": %.0f}\n", stats);
}
