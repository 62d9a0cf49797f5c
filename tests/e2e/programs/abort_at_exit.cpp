// A C++ libtorch program that trains a few seeded steps, prints its result, then dies at exit of
// SIGABRT from a thread an exit handler starts: a library's worker meeting teardown.
//
//   abort_at_exit [steps]
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "detaudit/marker.h"

int main(int argc, char** argv) {
  std::atexit([] { std::thread([] { std::abort(); }).join(); });
  const int steps = argc > 1 ? std::atoi(argv[1]) : 3;
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 2));
  torch::optim::SGD opt(net->parameters(), 0.1);
  const torch::Tensor x = torch::randn({32, 8});
  const torch::Tensor y = torch::randint(0, 2, {32});
  for (int step = 0; step < steps; ++step) {
    DETAUDIT_STEP();
    opt.zero_grad();
    torch::Tensor loss = torch::nn::functional::cross_entropy(net->forward(x), y);
    loss.backward();
    {
      DETAUDIT_OPTIMIZER();
      opt.step();
    }
    std::printf("step %d loss %.6f\n", step, loss.item<float>());
  }
  std::printf("done; aborting at exit\n");
  std::fflush(stdout);
  return 0;
}
