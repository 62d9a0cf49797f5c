"""grid_sample of an 8x8 input at 256x256 grid points on CUDA, float32: the backward adds each
point's gradient into the 4 input pixels around it with atomics, about 4000 per pixel (catalog
grid-sampler-2d-backward-cuda; no deterministic kernel). Only the input needs a gradient."""
import torch
import torch.nn.functional as F

from gpu_common import data, parse_args, train


def main():
    args = parse_args(__doc__)
    x = torch.nn.Parameter(data(2, 16, 8, 8))
    grid = torch.tanh(data(2, 256, 256, 2, seed=1))  # points inside [-1, 1]
    weight = data(2, 16, 256, 256, seed=2)

    def step():
        y = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        return (y * weight).sum(), lambda: x.grad

    train(args, [x], step, "input gradient")


if __name__ == "__main__":
    main()
