"""adaptive_avg_pool2d from 4x4 to 128x128 on CUDA, float32: the backward's atomic kernel adds
about 1024 output gradients into each input element (catalog adaptive-avg-pool2d-backward-cuda;
no deterministic kernel)."""
import torch
import torch.nn.functional as F

from gpu_common import data, parse_args, train


def main():
    args = parse_args(__doc__)
    x = torch.nn.Parameter(data(2, 16, 4, 4))
    weight = data(2, 16, 128, 128, seed=2)

    def step():
        y = F.adaptive_avg_pool2d(x, (128, 128))
        return (y * weight).sum(), lambda: x.grad

    train(args, [x], step, "input gradient")


if __name__ == "__main__":
    main()
