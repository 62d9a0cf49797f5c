"""Bilinear upsampling 16x16 -> 512x512 on CUDA, float32: its backward adds about 4096 output
gradients into each input pixel with atomics (catalog upsample-bilinear2d-backward-cuda).
With deterministic mode on before the forward, F.interpolate decomposes into index ops."""
import torch
import torch.nn.functional as F

from gpu_common import data, parse_args, train


def main():
    args = parse_args(__doc__)
    x = torch.nn.Parameter(data(2, 8, 16, 16))
    weight = data(2, 8, 512, 512, seed=2)

    def step():
        y = F.interpolate(x, size=(512, 512), mode="bilinear", align_corners=False)
        return (y * weight).sum(), lambda: x.grad

    train(args, [x], step, "input gradient")


if __name__ == "__main__":
    main()
