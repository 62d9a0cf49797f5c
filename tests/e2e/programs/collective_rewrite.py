"""Two gloo ranks that use each all-reduce's result the moment it is there, as programs do: DDP's
reducer copies a bucket out and its next backward writes into it, a comm hook's `then` rescales
it. A recorder that hashes the received buffer later than its completion sees those writes.

    python collective_rewrite.py --launch env [--calls 40]

Each call all-reduces a seeded tensor, then writes the result in place at once, in one of five
ways (taken in turn):
  work    work.wait(), then an in-place op;
  future  work.get_future().wait(), then an in-place op (a future's waiter wakes before the
          future's callbacks run);
  then    a `then` callback on the future scales the buffer through NumPy, on gloo's thread (an
          op there would be recorded on whichever of gloo's threads ran it: issue 25);
  sync    dist.all_reduce() without async_op, then an in-place op;
  numpy   work.wait(), then a write through NumPy, which no op records.
With --functional, each call goes through torch 2.x's functional collectives instead
(`_c10d_functional::all_reduce`, as DTensor and compiled code call them), which return the buffer
before it is filled. (No all-gather: gloo runs its copies on whichever of its threads is free,
recorded there as ops in an order that follows timing, issue 25.)
Every rank prints, per call, the MD5 of what the all-reduce must produce: with two ranks, gloo's
sum is a0 + a1, computed here from both ranks' seeded inputs before the call.
"""
import argparse
import hashlib
import os
import subprocess
import sys

from ports import free_port

# Imported by the ranks only (main_rank): `--launch env`'s parent starts them, importing no torch.
torch = dist = None

MODES = ["work", "future", "then", "sync", "numpy"]


def md5(t):
    return hashlib.md5(t.detach().contiguous().numpy().tobytes()).hexdigest()


def np_scale(t):
    t.numpy()[:] *= 0.5
    return t


def contribution(call, rank, n):
    return torch.randn(n, generator=torch.Generator().manual_seed(1000 * call + rank))


def main_rank(rank, world, calls, n, functional):
    global torch, dist
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    lines = []
    for call in range(calls):
        mode = "functional" if functional else MODES[call % len(MODES)]
        expected = sum(contribution(call, r, n) for r in range(world))
        buf = contribution(call, rank, n)
        if mode == "functional":
            import torch.distributed._functional_collectives as funcol
            buf = funcol.all_reduce(buf, "sum", dist.group.WORLD) * 0.5
        elif mode == "sync":
            dist.all_reduce(buf)
            buf.mul_(0.5)
        elif mode == "then":
            fut = dist.all_reduce(buf, async_op=True).get_future()
            fut.then(lambda f: np_scale(f.value()[0])).wait()
        else:
            work = dist.all_reduce(buf, async_op=True)
            if mode == "future":
                work.get_future().wait()
            else:
                work.wait()
            if mode == "numpy":
                np_scale(buf)
            else:
                buf.mul_(0.5)
        lines.append(f"rank {rank} call {call} {mode} expected {md5(expected)} "
                     f"after {md5(buf)}")
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launch", choices=["env", "none"], default="none")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--numel", type=int, default=4096)
    ap.add_argument("--functional", action="store_true")
    ap.add_argument("--port", type=int, default=0, help="0: one the kernel says is free")
    args = ap.parse_args()
    args.port = args.port or free_port()
    if args.launch == "none":
        main_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args.calls, args.numel,
                  args.functional)
        return
    base = dict(os.environ, WORLD_SIZE=str(args.world), MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(args.port))
    argv = [sys.executable, __file__, "--launch", "none", "--calls", str(args.calls),
            "--numel", str(args.numel)] + (["--functional"] if args.functional else [])
    procs = [subprocess.Popen(argv, env=dict(base, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(args.world)]
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
