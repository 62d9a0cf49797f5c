// A small C++ libtorch training program: a CNN with convolutions, batchnorm, pooling, linear and
// dropout layers, trained with SGD on synthetic data. detaudit records it unchanged; the one
// detaudit line is the optional step marker.
//
//   train_cnn [--steps N] [--threads N] [--batch N] [--race] [--race-from K] [--params-out FILE]
//             [--no-marker] [--mark-backward] [--abort-at-exit]
//
// --abort-at-exit: after its last step the program dies of SIGABRT at exit, from a thread an exit
// handler starts, as a library's worker does when it meets teardown (gloo's, pytorch PR 179291).
//
// --no-marker leaves out the detaudit step and optimizer marks: the program detaudit sees is then
// a plain libtorch loop (recorded as one step 0).
//
// --mark-backward adds the optional backward mark (DETAUDIT_BACKWARD), which lets `run --sentinel`
// leave the forward and backward ops unseen.
//
// --race adds a gather from a large parameter (w[idx] with repeated indices) whose backward,
// index_put_(accumulate=True), races on float atomics with more than one intra-op thread; with
// --race-from K, from step K on. It adds 4M values (about 27 ms a step on 2 threads).
#include <detaudit/marker.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

namespace {

struct Net : torch::nn::Module {
  Net() {
    conv1 = register_module("conv1",
                            torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(16));
    conv2 = register_module("conv2",
                            torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(32));
    fc1 = register_module("fc1", torch::nn::Linear(32 * 8 * 8, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 10));
    drop = register_module("drop", torch::nn::Dropout(0.2));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(bn1(conv1(x))), 2);
    x = torch::avg_pool2d(torch::relu(bn2(conv2(x))), 2);
    x = drop(torch::relu(fc1(x.flatten(1))));
    return fc2(x);
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
};

}  // namespace

int main(int argc, char** argv) {
  int steps = 3, threads = 0, batch = 16, race_from = 0;
  bool race = false, marker = true, mark_backward = false;
  std::string params_out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc)
      steps = std::stoi(argv[++i]);
    else if (a == "--threads" && i + 1 < argc)
      threads = std::stoi(argv[++i]);
    else if (a == "--batch" && i + 1 < argc)
      batch = std::stoi(argv[++i]);
    else if (a == "--race")
      race = true;
    else if (a == "--race-from" && i + 1 < argc)
      race = true, race_from = std::stoi(argv[++i]);
    else if (a == "--params-out" && i + 1 < argc)
      params_out = argv[++i];
    else if (a == "--no-marker")
      marker = false;
    else if (a == "--mark-backward")
      mark_backward = true;
    else if (a == "--abort-at-exit")
      std::atexit([] { std::thread([] { std::abort(); }).join(); });
    else {
      std::fprintf(stderr,
                   "usage: train_cnn [--steps N] [--threads N] [--batch N] [--race] "
                   "[--race-from K] [--params-out FILE] [--no-marker] [--mark-backward] "
                   "[--abort-at-exit]\n");
      return 2;
    }
  }
  if (threads > 0) torch::set_num_threads(threads);
  torch::manual_seed(0);
  auto net = std::make_shared<Net>();
  torch::Tensor table = torch::randn({1 << 17}, torch::requires_grad());
  std::vector<torch::Tensor> params = net->parameters();
  if (race) params.push_back(table);
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.01).momentum(0.9));

  torch::Tensor images = torch::randn({batch, 3, 32, 32});
  torch::Tensor labels = torch::randint(0, 10, {batch});
  // Many repeats, 4M: each thread adds for longer than a time slice, so the race shows in nearly
  // every step even on a loaded machine (with fewer, one thread often ran before the other).
  const int64_t gathered = int64_t(1) << 22;
  torch::Tensor index = torch::randint(0, 1 << 12, {gathered});
  // Distinct addends per slot: with equal ones, any summation order gives the same bits.
  torch::Tensor target = torch::randn({gathered});
  for (int step = 0; step < steps; ++step) {
    std::optional<detaudit::StepGuard> step_mark;
    if (marker) step_mark.emplace();  // DETAUDIT_STEP(), optional for the unmarked case
    optimizer.zero_grad();
    torch::Tensor loss = torch::nll_loss(torch::log_softmax(net->forward(images), 1), labels);
    if (race && step >= race_from) loss = loss + (table.index({index}) - target).pow(2).mean();
    if (mark_backward) {
      DETAUDIT_BACKWARD(loss);
      loss.backward();
    } else {
      loss.backward();
    }
    if (marker) {
      DETAUDIT_OPTIMIZER();
      optimizer.step();
    } else {
      optimizer.step();
    }
    std::printf("step %d loss %.6f\n", step, loss.item<double>());
  }
  if (!params_out.empty()) {
    // The exact bits of every parameter, for bit-identity checks.
    std::ofstream out(params_out, std::ios::binary);
    for (const torch::Tensor& p : params) {
      torch::Tensor c = p.detach().contiguous();
      out.write(static_cast<const char*>(c.data_ptr()), std::streamsize(c.nbytes()));
    }
  }
  return 0;
}
