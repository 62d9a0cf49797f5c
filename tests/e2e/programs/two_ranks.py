"""Two ranks started by hand (RANK=0 and RANK=1, as a launcher would), each training the same
seeded model; rank 1 calls torch.seed() after the init, so its dropout masks, and from there its
loss, differ run to run. Rank 0 stays identical. Each rank prints its loss per step.

    python two_ranks.py --steps 6
"""
import argparse
import os
import subprocess
import sys


def train(rank, steps):
    # Here, not at the top: the parent only starts the ranks, and importing torch there would
    # cost 2 s of CPU for nothing.
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 2))
    x = torch.randn(steps, 8, 16)
    y = torch.randint(0, 2, (steps, 8))
    if rank == 1:
        torch.seed()  # the bug, on one rank only
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    for step in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x[step]), y[step])
        loss.backward()
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.9f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rank", type=int)
    args = ap.parse_args()
    if args.rank is not None:
        train(args.rank, args.steps)
        return
    procs = [subprocess.Popen([sys.executable, __file__, "--steps", str(args.steps), "--rank",
                               str(r)], env=dict(os.environ, RANK=str(r), WORLD_SIZE="2"))
             for r in (0, 1)]
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
