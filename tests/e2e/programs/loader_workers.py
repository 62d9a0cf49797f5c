"""A training loop fed by a DataLoader with worker processes, the most common shape of all.

    python loader_workers.py --steps 4 [--workers 2] [--unseeded-augment] [--persistent]

Seeded as a careful user seeds it (torch.manual_seed, a seeded `generator=`, `worker_init_fn`),
its runs are identical. With --unseeded-augment the Dataset adds noise from a NumPy Generator
created without a seed: each run's batches differ, made inside the workers. The program prints
the MD5 of each batch it trains on (the digest detaudit records for it), so a test can tell which
batches really differed and which ops made them.
"""
import argparse
import hashlib
import random

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __init__(self, unseeded_augment):
        # Created in the main process; forked workers inherit its state.
        self.noise = np.random.default_rng() if unseeded_augment else None

    def __len__(self):
        return 96

    def __getitem__(self, i):
        x = torch.linspace(0, 1, 8) * (i + 1)  # ops inside the worker
        if self.noise is not None:
            x = x + torch.from_numpy(self.noise.normal(size=8).astype(np.float32))
        x = x.sin()
        return x, x.pow(2).sum(dim=0, keepdim=True)


def seed_worker(worker_id):
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--unseeded-augment", action="store_true")
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--epochs", type=int, default=1)
    args = ap.parse_args()

    torch.manual_seed(0)
    g = torch.Generator()
    g.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loader = DataLoader(Samples(args.unseeded_augment), batch_size=8, shuffle=True,
                        num_workers=args.workers, worker_init_fn=seed_worker, generator=g,
                        persistent_workers=args.persistent and args.workers > 0)
    step = 0
    loss = torch.tensor(0.0)
    for _ in range(args.epochs):
        for x, y in loader:
            if step >= args.steps * (_ + 1):
                break
            print(f"step {step} batch md5 {hashlib.md5(x.numpy().tobytes()).hexdigest()}")
            opt.zero_grad()
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            step += 1
    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
