"""torchvision's roi_align on CUDA, float32: 2048 boxes over one 32x32 feature map, whose
backward adds into the shared feature map with atomics (catalog torchvision-roi-align-backward).
In deterministic mode torchvision computes it with plain torch ops instead."""
import torch
import torchvision

from gpu_common import data, parse_args, train


def main():
    args = parse_args(__doc__)
    feat = torch.nn.Parameter(data(1, 32, 32, 32))
    k = 2048
    corners = torch.sort(torch.rand(k, 2, 2, generator=torch.Generator().manual_seed(1)) * 31,
                         dim=1).values  # x1 <= x2, y1 <= y2
    boxes = torch.cat([torch.zeros(k, 1), corners[:, 0], corners[:, 1]], 1).cuda()
    weight = data(k, 32, 7, 7, seed=2)

    def step():
        y = torchvision.ops.roi_align(feat, boxes, output_size=7, spatial_scale=1.0,
                                      sampling_ratio=2, aligned=True)
        return (y * weight).sum(), lambda: feat.grad

    train(args, [feat], step, "feature gradient")


if __name__ == "__main__":
    main()
