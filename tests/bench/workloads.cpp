// The benchmark workloads in C++ libtorch; times its own steps and prints one JSON line.
//
//   bench_workloads --workload cnn|embed|lstm [--steps N] [--warmup N] [--threads N]
#include <detaudit/marker.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>

namespace {

using Step = std::function<void()>;

// The backward, marked with its loss as a C++ program marks its phases (detaudit/marker.h).
void backward(const torch::Tensor& loss) {
  DETAUDIT_BACKWARD(loss);
  loss.backward();
}

Step cnn() {
  torch::nn::Sequential model;
  int64_t c = 3;
  for (int64_t width : {32, 32, 64, 64, 128, 128}) {
    model->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(c, width, 3).padding(1)));
    model->push_back(torch::nn::BatchNorm2d(width));
    model->push_back(torch::nn::ReLU());
    c = width;
    if (width == 32 || width == 64) model->push_back(torch::nn::MaxPool2d(2));
  }
  model->push_back(torch::nn::AdaptiveAvgPool2d(4));
  model->push_back(torch::nn::Flatten());
  model->push_back(torch::nn::Linear(128 * 16, 256));
  model->push_back(torch::nn::ReLU());
  model->push_back(torch::nn::Dropout(0.2));
  model->push_back(torch::nn::Linear(256, 10));
  auto opt = std::make_shared<torch::optim::SGD>(model->parameters(),
                                                 torch::optim::SGDOptions(0.01).momentum(0.9));
  auto x = torch::randn({32, 3, 64, 64});
  auto y = torch::randint(0, 10, {32});
  return [=]() mutable {
    DETAUDIT_STEP();
    opt->zero_grad();
    backward(torch::nn::functional::cross_entropy(model->forward(x), y));
    DETAUDIT_OPTIMIZER();
    opt->step();
  };
}

Step embed() {
  torch::nn::Embedding emb(50000, 64);
  torch::nn::Sequential mlp(torch::nn::Linear(64, 256), torch::nn::ReLU(),
                            torch::nn::Linear(256, 256), torch::nn::ReLU(),
                            torch::nn::Linear(256, 2));
  auto params = emb->parameters();
  for (auto& p : mlp->parameters()) params.push_back(p);
  auto opt = std::make_shared<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3));
  auto tokens = torch::randint(0, 50000, {256, 32});
  auto y = torch::randint(0, 2, {256});
  return [=]() mutable {
    DETAUDIT_STEP();
    opt->zero_grad();
    backward(torch::nn::functional::cross_entropy(mlp->forward(emb->forward(tokens).mean(1)), y));
    DETAUDIT_OPTIMIZER();
    opt->step();
  };
}

Step lstm() {
  torch::nn::LSTMCell cell(16, 32);
  torch::nn::Linear head(32, 1);
  auto params = cell->parameters();
  for (auto& p : head->parameters()) params.push_back(p);
  auto opt = std::make_shared<torch::optim::SGD>(params, torch::optim::SGDOptions(0.01));
  auto xs = torch::randn({100, 4, 16});
  auto target = torch::randn({4, 1});
  return [=]() mutable {
    DETAUDIT_STEP();
    opt->zero_grad();
    auto h = torch::zeros({4, 32}), c = torch::zeros({4, 32});
    for (int64_t t = 0; t < xs.size(0); ++t)
      std::tie(h, c) = cell->forward(xs[t], std::make_tuple(h, c));
    backward(torch::mse_loss(head->forward(h), target));
    DETAUDIT_OPTIMIZER();
    opt->step();
  };
}

}  // namespace

// User and system time of all threads: unlike wall time, not inflated when the hypervisor runs
// another guest on our cores.
double cpu_ms() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
          double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3);
}

int main(int argc, char** argv) {
  std::string workload;
  int steps = 5, warmup = 2, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--workload")
      workload = argv[i + 1];
    else if (a == "--steps")
      steps = std::stoi(argv[i + 1]);
    else if (a == "--warmup")
      warmup = std::stoi(argv[i + 1]);
    else if (a == "--threads")
      threads = std::stoi(argv[i + 1]);
  }
  torch::set_num_threads(threads);
  torch::manual_seed(0);
  Step step = workload == "cnn"     ? cnn()
              : workload == "embed" ? embed()
              : workload == "lstm"  ? lstm()
                                    : Step();
  if (!step) {
    std::fprintf(stderr,
                 "usage: bench_workloads --workload cnn|embed|lstm [--steps N] [--warmup N] "
                 "[--threads N]\n");
    return 2;
  }
  for (int i = 0; i < warmup; ++i) step();
  const double cpu0 = cpu_ms();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("{\"ms_per_step\": %.3f, \"cpu_ms_per_step\": %.3f, \"peer_bytes_per_step\": 0}\n",
              ms / steps, (cpu_ms() - cpu0) / steps);
  return 0;
}
