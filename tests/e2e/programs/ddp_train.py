"""Data-parallel training over gloo on two CPU ranks, as users launch it.

    python ddp_train.py --launch env     # starts its ranks with RANK/WORLD_SIZE/MASTER_* set
    python ddp_train.py --launch spawn   # torch.multiprocessing.spawn: ranks know only their index
    srun python ddp_train.py --launch slurm --port P   # one task a rank: SLURM_PROCID, SLURM_NTASKS
    torchrun --nproc-per-node 2 ddp_train.py

Each rank trains a seeded DDP model on its own shard. Options make one rank misbehave:
  --race-rank R     rank R's model gathers its input through an embedding-like `w[idx]`, whose
                    backward is the CPU index_put_(accumulate=True) race on 2 threads (2^22
                    values into 2,048 slots);
  --corrupt-rank R  after step --corrupt-step's optimizer step, rank R changes a parameter in
                    place with no collective: the replicas now disagree;
  --kill-rank R     rank R kills itself with SIGKILL in step --kill-step, between its forward and
                    backward pass; with --kill-marker PATH only once PATH exists (it is created
                    otherwise), so that the second of two runs dies and the first does not;
  --teardown-abort-rank R
                    rank R leaves a collective's completion callback running Python as the
                    interpreter exits: gloo's thread then meets interpreter teardown and torch
                    aborts the process (SIGABRT, "terminate called without an active exception"),
                    torch's own teardown race (pytorch PR 179291) made to happen every time.
  --exit-at-once    each rank leaves through os._exit(0) once its process group is destroyed,
                    as a DataLoader worker does: no interpreter teardown, so no teardown abort
                    (tests whose subject is not that race; under torchrun, a node whose rank
                    aborted fails, and the other waits 300 s at torch's exit barrier for it).
--optimizer adam and --threads 1 make it the plain loop users write most: Adam, one intra-op thread
a rank (as torchrun sets).
Every rank prints, per step, the MD5 of the all-reduced loss and of its gradients in DDP's bucket
order, and at the end the MD5 of its parameters.
"""
import argparse
import hashlib
import os
import signal
import sys
import threading
import time

from ports import free_port

# Imported by the processes that train (import_torch): `--launch env`'s parent only starts the
# ranks, and importing torch there would cost 2 s of CPU for nothing.
torch = dist = nn = None


def import_torch():
    global torch, dist, nn
    import torch
    import torch.distributed as dist
    import torch.nn as nn


def say(line):
    # One write per line: the ranks share the output.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def md5(t):
    return hashlib.md5(t.detach().contiguous().numpy().tobytes()).hexdigest()


def make_net(gather, table_size):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.gather = gather
            self.table = nn.Parameter(torch.randn(table_size) * 0.01)
            self.fc1 = nn.Linear(16, 32)
            self.fc2 = nn.Linear(32, 2)

        def forward(self, x, idx):
            if self.gather:
                x = x + self.table[idx].view(x.shape[0], -1, 16).mean(1)
            else:
                x = x + self.table[:16]
            return self.fc2(torch.relu(self.fc1(x)))

    return Net()


def train(rank, world, args):
    import_torch()
    if "MASTER_ADDR" not in os.environ:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        make_net(rank == args.race_rank, 1 << 17 if args.race_rank >= 0 else 16))
    opt = (torch.optim.Adam(model.parameters(), lr=1e-3) if args.optimizer == "adam" else
           torch.optim.SGD(model.parameters(), lr=0.1))
    gen = torch.Generator().manual_seed(1000 + rank)
    n = model.module.table.numel()
    for step in range(args.steps):
        x = torch.randn(8, 16, generator=gen)
        y = torch.randint(0, 2, (8,), generator=gen)
        # 2^22 indices: the racing rank's threads add for tens of milliseconds, so the scheduler
        # interleaves them even on a loaded machine, and the bits differ in nearly every step.
        idx = torch.randint(0, max(n // 64, 1), (1 << 22 if args.race_rank >= 0 else 128,),
                            generator=gen)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x, idx), y)
        if rank == args.kill_rank and step == args.kill_step and kill_now(args.kill_marker):
            os.kill(os.getpid(), signal.SIGKILL)
        loss.backward()
        # DDP's bucket holds the gradients in reverse order after its first step (it rebuilds
        # its buckets in the order gradients became ready) and in parameter order before.
        grads = [p.grad.flatten() for p in model.parameters()]
        bucket, bucket_fwd = torch.cat(grads[::-1]), torch.cat(grads)
        opt.step()
        if rank == args.corrupt_rank and step == args.corrupt_step:
            with torch.no_grad():
                model.module.fc1.bias.add_(1e-3)
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        say(f"rank {rank} step {step} loss-sum {logged.item():.9f} "
            f"loss-sum-md5 {md5(logged)} bucket-md5 {md5(bucket)} {md5(bucket_fwd)}")
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    say(f"rank {rank} final {md5(params)}")
    if args.teardown_abort_rank >= 0:
        leave_a_callback_running(rank == args.teardown_abort_rank)
        return
    dist.destroy_process_group()
    if args.exit_at_once:
        os._exit(0)


def kill_now(marker):
    if not marker:
        return True
    if os.path.exists(marker):
        return True
    open(marker, "w").close()
    return False


def leave_a_callback_running(mine):
    """An all-reduce whose completion callback runs Python on gloo's thread until the interpreter
    finalizes: taking the GIL back then ends that thread inside C++ that may not throw, and torch
    aborts the process."""
    started = threading.Event()

    def late(fut):
        if threading.current_thread() is threading.main_thread():
            # The Work had completed before .then(): the callback runs inline, here, and would
            # loop forever on the main thread. Say so and fail instead of hanging.
            raise SystemExit("teardown abort not set up: the all-reduce completed before .then()")
        started.set()
        while True:  # each sleep gives the GIL back; taking it again at teardown kills the thread
            time.sleep(0.001)

    if not mine:
        # Joins late, so that the other rank's Work is still pending when it attaches .then():
        # a completed Work runs the callback inline on the main thread.
        time.sleep(1.0)
    work = dist.all_reduce(torch.ones(4), async_op=True)
    if mine:
        work.get_future().then(late)
        started.wait()
    else:
        work.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launch", choices=["env", "spawn", "slurm", "none"], default="none",
                    help="none: this process is one rank of a launcher (RANK is set)")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--port", type=int, default=0, help="0: one the kernel says is free")
    ap.add_argument("--race-rank", type=int, default=-1)
    ap.add_argument("--corrupt-rank", type=int, default=-1)
    ap.add_argument("--corrupt-step", type=int, default=1)
    ap.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kill-rank", type=int, default=-1)
    ap.add_argument("--kill-step", type=int, default=1)
    ap.add_argument("--kill-marker", default="")
    ap.add_argument("--teardown-abort-rank", type=int, default=-1)
    ap.add_argument("--exit-at-once", action="store_true")
    args = ap.parse_args()
    args.port = args.port or free_port()
    if args.launch == "none":
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
    elif args.launch == "slurm":
        # As SLURM users write it: the rank and world from srun's task variables.
        train(int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"]), args)
    elif args.launch == "spawn":
        import_torch()
        torch.multiprocessing.spawn(train, args=(args.world, args), nprocs=args.world)
    else:
        import subprocess
        base = dict(os.environ, WORLD_SIZE=str(args.world), MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(args.port))
        argv = [a for a in sys.argv[1:] if a not in ("--launch", "env")]
        procs = [subprocess.Popen([sys.executable, __file__, "--launch", "none", *argv],
                                  env=dict(base, RANK=str(r), LOCAL_RANK=str(r)))
                 for r in range(args.world)]
        sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
