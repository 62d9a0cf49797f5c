"""index_add_ on CUDA, float32, 1024 duplicates of every index: atomic adds whose order changes
from run to run (catalog index-add-cuda). Nothing else in the program is nondeterministic."""
import torch

from gpu_common import data, parse_args, train


def main():
    args = parse_args(__doc__)
    n, rows, cols = 1 << 18, 256, 64
    src = torch.nn.Parameter(data(n, cols))
    idx = data(n, low=0, high=rows, seed=1)
    weight = data(rows, cols, seed=2)
    out = {}

    def step():
        out["t"] = torch.zeros(rows, cols, device="cuda").index_add_(0, idx, src)
        return (out["t"] * weight).sum(), lambda: out["t"]

    train(args, [src], step, "index_add_ output")


if __name__ == "__main__":
    main()
