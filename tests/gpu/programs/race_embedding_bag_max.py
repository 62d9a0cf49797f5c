"""embedding_bag(mode='max') on CUDA, float32: 65536 bags of 8 rows from a 32-row table, so the
backward adds about 2000 bag gradients into each weight element with atomics (catalog
embedding-bag-max-backward-cuda; no deterministic kernel)."""
import torch
import torch.nn.functional as F

from gpu_common import data, parse_args, train


def main():
    args = parse_args(__doc__)
    rows, dim, bags, per_bag = 32, 64, 1 << 16, 8
    table = torch.nn.Parameter(data(rows, dim))
    indices = data(bags * per_bag, low=0, high=rows, seed=1)
    offsets = torch.arange(0, bags * per_bag, per_bag, device="cuda")
    weight = data(bags, dim, seed=2)

    def step():
        y = F.embedding_bag(indices, table, offsets, mode="max")
        return (y * weight).sum(), lambda: table.grad

    train(args, [table], step, "table gradient")


if __name__ == "__main__":
    main()
