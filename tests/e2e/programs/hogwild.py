"""Hogwild training, as in pytorch/examples' mnist_hogwild: a seeded model in shared memory
(share_memory()), trained by two torch.multiprocessing processes at once with no lock, on
seeded data of their own. Whose update lands first follows timing, so the final parameters
differ run to run.

    python hogwild.py                # both workers at once, after a barrier
    python hogwild.py --sequential   # one worker after the other: the same every run
    python hogwild.py --sharing file_system   # shared through libshm's files, not descriptors
    python hogwild.py --late-worker 0.3  # worker 0 starts 0.3 s after worker 1: its first
                                         # forward reads parameters worker 1 is updating

The parent prints the MD5 of the shared parameters before the workers start and at the end,
each worker when it is done.
"""
import argparse
import hashlib
import time

import torch
import torch.multiprocessing as mp
import torch.nn as nn

try:  # torch 2's optimizers import torch._dynamo (2 s of CPU): once here, not in each worker
    import torch._dynamo  # noqa: F401
except ImportError:
    pass  # torch 1.x


def md5(model):
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    return hashlib.md5(flat.numpy().tobytes()).hexdigest()


def train(rank, model, steps, barrier, late=0.0):
    torch.manual_seed(1 + rank)
    torch.set_num_threads(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if barrier is not None:
        barrier.wait()
    if rank == 0 and late:
        time.sleep(late)
    for _ in range(steps):
        x, y = torch.randn(32, 16), torch.randn(32, 1)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"worker {rank} done {md5(model)}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--sequential", action="store_true")
    ap.add_argument("--late-worker", type=float, default=0.0, metavar="SECONDS")
    ap.add_argument("--sharing", choices=mp.get_all_sharing_strategies(), default="file_descriptor")
    args = ap.parse_args()
    mp.set_sharing_strategy(args.sharing)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    model.share_memory()
    print(f"start {md5(model)}", flush=True)  # the parent reads the shared parameters once
    if args.sequential:
        for rank in range(2):
            p = mp.Process(target=train, args=(rank, model, args.steps, None))
            p.start()
            p.join()
    else:
        barrier = mp.Barrier(2)
        procs = [mp.Process(target=train, args=(rank, model, args.steps, barrier, args.late_worker))
                 for rank in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    print(f"final {md5(model)}", flush=True)


if __name__ == "__main__":
    main()
