"""A long seeded training loop that goes wrong late, for the sentinel's tests.

    python long_run.py --steps 1000 --race-from 900
    python long_run.py --steps 300 --perturb 2:250 --perturb-count counter.txt

--race-from K   from step K on, the model gathers its input through `table[idx]`: its backward is
                the CPU index_put_(accumulate=True) race on 2 threads (--race-size values, 2^22 by
                default, into 256 slots), so runs differ from step K on and not before. Each
                thread adds for longer than a time slice: even on a loaded machine, where the two
                rarely run at once, the scheduler interleaves them, and the bits differ in
                nearly every step. (With both cores busy, 2^20 values take 8 ms, one thread's
                half often done before the other's starts: 8 distinct sums in 40; 2^22, 32 ms:
                40 in 40.)
--perturb N:K   with --perturb-count FILE: the program counts its runs in FILE; its N-th run scales
                step K's batch by 1 + 1e-6 (repeatable). The difference happens once and never
                again, as a rare race would.
--extra-draw N:K with --perturb-count FILE: the N-th run draws once more from torch's generator
                after step K's update, changing nothing it trains on (repeatable).
Prints each step's loss (every 100 steps) and the MD5 of the parameters at the end.
"""
import argparse
import hashlib

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(256) * 0.01)
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 2)

    def forward(self, x, idx=None):
        if idx is not None:
            x = x + self.table[idx].view(x.shape[0], -1, 16).mean(1)
        return self.fc2(torch.relu(self.fc1(x)))


def count_run(path):
    try:
        with open(path) as f:
            n = int(f.read() or 0)
    except FileNotFoundError:
        n = 0
    with open(path, "w") as f:
        f.write(str(n + 1))
    return n + 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--race-from", type=int, default=-1)
    ap.add_argument("--race-size", type=int, default=1 << 22)
    ap.add_argument("--perturb", action="append", default=[], metavar="RUN:STEP")
    ap.add_argument("--extra-draw", action="append", default=[], metavar="RUN:STEP")
    ap.add_argument("--perturb-count", default="")
    a = ap.parse_args()
    run = count_run(a.perturb_count) if a.perturb_count else 0
    perturbed = {int(s) for r, s in (p.split(":") for p in a.perturb) if int(r) == run}
    draws = {int(s) for r, s in (p.split(":") for p in a.extra_draw) if int(r) == run}

    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    for step in range(a.steps):
        x = torch.randn(64, 16, generator=gen)
        y = torch.randint(0, 2, (64,), generator=gen)
        idx = None
        if 0 <= a.race_from <= step:
            idx = torch.randint(0, 256, (a.race_size,), generator=gen)
        if step in perturbed:
            x = x * (1 + 1e-6)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x, idx), y)
        loss.backward()
        opt.step()
        if step in draws:
            torch.rand(7)
        if step % 100 == 0 or step == a.steps - 1:
            print(f"step {step} loss {loss.item():.9f}", flush=True)
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    print("final", hashlib.md5(params.numpy().tobytes()).hexdigest(), flush=True)


if __name__ == "__main__":
    main()
