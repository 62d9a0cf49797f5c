"""A compiled loss over a gather on CUDA: its backward, an index_put with accumulate, is a Triton
kernel inductor generates with tl.atomic_add (many rows collide), so the gradient's bits differ
run to run; with --deterministic inductor calls aten's deterministic kernel instead.

    python compiled_index_add_cuda.py [--steps 2] [--deterministic]
"""
import torch

from gpu_common import checksum, data, parse_args


def main():
    args = parse_args(__doc__)
    table = torch.nn.Parameter(data(64, 16))
    weights = data(1 << 20, 16, seed=1)
    idx = data(1 << 20, low=0, high=64, seed=2)
    compiled = torch.compile(lambda t, i, w: (t[i] * w).sum())
    for step in range(args.steps):
        table.grad = None
        compiled(table, idx, weights).backward()
        print(f"step {step} feature gradient checksum {checksum(table.grad)}", flush=True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
