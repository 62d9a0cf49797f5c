"""scatter_add_ on CUDA, float32, 2^20 values into 1024 slots: gpuAtomicAdd in an order that
changes from run to run (catalog scatter-add-cuda)."""
import torch

from gpu_common import data, parse_args, train


def main():
    args = parse_args(__doc__)
    n, slots = 1 << 20, 1024
    src = torch.nn.Parameter(data(n))
    idx = data(n, low=0, high=slots, seed=1)
    weight = data(slots, seed=2)
    out = {}

    def step():
        out["t"] = torch.zeros(slots, device="cuda").scatter_add_(0, idx, src)
        return (out["t"] * weight).sum(), lambda: out["t"]

    train(args, [src], step, "scatter_add_ output")


if __name__ == "__main__":
    main()
