"""A small model trained through torch.compile (inductor on the CPU), seeded unless asked not to.

    python compiled_model.py --steps 2 [--threads N] [--unseeded-dropout]

--threads N runs the compiled kernels on N intra-op threads: a large reduction inside the compiled
region then sums in another order. --unseeded-dropout draws dropout masks inside the region from an
unseeded generator.
"""
import argparse
import hashlib

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--unseeded-dropout", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256))
    x = torch.randn(1024, 256)
    y = torch.randn(1024, 256)
    if args.unseeded_dropout:
        torch.seed()

    def loss_fn(x, y):
        h = net(x)
        if args.unseeded_dropout:
            h = nn.functional.dropout(h, p=0.5)
        # One reduction over 256K values: its order depends on the thread count.
        return ((h - y) ** 2).mean()

    compiled = torch.compile(loss_fn)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for _ in range(args.steps):
        opt.zero_grad()
        loss = compiled(x, y)
        loss.backward()
        opt.step()
    h = hashlib.sha256()
    for p in net.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    print(f"final loss {loss.item():.6f} params sha256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
