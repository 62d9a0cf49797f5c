"""Seeded models whose layers are created while iterating a Python set of names, then used in a
fixed order: each run draws the same initial values in the same op order, but hands them to
other layers when PYTHONHASHSEED is unset. Real layers, read the way real models read them, in
one forward and backward.

    python set_order_models.py linear       # nn.Linear layers: addmm's expanded bias, linear
    python set_order_models.py conv         # nn.Conv2d layers: conv2d's weight and bias
    python set_order_models.py embedding    # nn.Embedding tables: index_select (embedding)
    python set_order_models.py transposed   # a weight used as w.t() in matmul

Prints the set's order and the loss.
"""
import sys

import torch
import torch.nn as nn

NAMES = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]


def layers(make):
    torch.manual_seed(0)
    created = {}
    for name in set(NAMES):  # the bug: a set's order follows the string hash
        created[name] = make()
    print("order", ",".join(n for n in set(NAMES)), flush=True)
    return nn.ModuleList(created[n] for n in NAMES)


def main():
    kind = sys.argv[1]
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    if kind == "linear":
        mods = layers(lambda: nn.Linear(16, 16))
        x = torch.randn(8, 16, generator=g)
        forward = lambda: mods[1](torch.relu(mods[0](x))).sum()  # noqa: E731
    elif kind == "conv":
        mods = layers(lambda: nn.Conv2d(3, 3, 3, padding=1))
        x = torch.randn(2, 3, 8, 8, generator=g)
        forward = lambda: mods[1](torch.relu(mods[0](x))).sum()  # noqa: E731
    elif kind == "embedding":
        mods = layers(lambda: nn.Embedding(32, 8))
        idx = torch.randint(0, 32, (16,), generator=g)
        forward = lambda: (mods[0](idx) * mods[1](idx)).sum()  # noqa: E731
    elif kind == "transposed":
        mods = layers(lambda: nn.Linear(16, 16, bias=False))
        x = torch.randn(8, 16, generator=g)
        forward = lambda: (x @ mods[0].weight.t() @ mods[1].weight.t()).sum()  # noqa: E731
    else:
        sys.exit(f"unknown kind {kind}")
    # One forward and backward: the first forward reads the layers, and differs there. No
    # optimizer: torch 2's imports torch._dynamo, which doubles the CPU a run costs.
    loss = forward()
    loss.backward()
    print(f"step 0 loss {loss.item():.9f}", flush=True)


if __name__ == "__main__":
    main()
