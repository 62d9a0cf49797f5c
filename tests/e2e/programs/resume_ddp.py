"""Two DDP ranks over gloo, started by hand (RANK, as a launcher would), that stop and resume from
a checkpoint like resume_loop.py: each rank saves and loads its own generator state beside the
shared model and optimizer (tests/e2e/test_resume.py).

    resume_ddp.py --steps N [--stop-at K --save PREFIX | --resume PREFIX] [--omit rng,optimizer]

--omit rng leaves each rank's generator out of its checkpoint; "optimizer", the resumed ranks
do not load the optimizer's state (SGD's momentum starts over).

A fresh process's first iteration fills DDP's gradient bucket in parameter order, and its second
rebuilds the bucket (a broadcast from rank 0): at the resume step each rank's all-reduce reads
the same values as in the run that went through, in another order (test_resume.py, DdpResume).
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def train(rank, args):
    # Here, not at the top: the parent only starts the ranks.
    import torch
    import torch.distributed as dist
    from torch import nn

    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.25), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    torch.manual_seed(1 + rank)  # each rank its own dropout masks
    data = torch.randn(64, 8, generator=torch.Generator().manual_seed(10 + rank))
    target = torch.randn(64, 1, generator=torch.Generator().manual_seed(20 + rank))
    start = 0
    if args.resume:
        ck = torch.load(f"{args.resume}.rank{rank}.pt")
        model.load_state_dict(ck["model"])
        if "optimizer" not in args.omit:
            opt.load_state_dict(ck["optimizer"])
        if "rng" in ck:
            torch.set_rng_state(ck["rng"])
        start = ck["step"]
    for step in range(start, args.steps):
        if args.stop_at is not None and step == args.stop_at:
            ck = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
            if "rng" not in args.omit:
                ck["rng"] = torch.get_rng_state()
            torch.save(ck, f"{args.save}.rank{rank}.pt")
            break
        idx = torch.arange(step % 8 * 8, step % 8 * 8 + 8)
        loss = nn.functional.mse_loss(model(data[idx]), target[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--stop-at", type=int)
    ap.add_argument("--save")
    ap.add_argument("--resume")
    ap.add_argument("--omit", default="")
    ap.add_argument("--rank", type=int)
    args = ap.parse_args()
    if args.rank is not None:
        train(args.rank, args)
        return
    from ports import free_port
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    procs = [subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--rank", str(r)],
                              env=dict(env, RANK=str(r))) for r in (0, 1)]
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
