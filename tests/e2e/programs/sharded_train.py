"""Sharded training over gloo on two or four CPU ranks, seeded, as users write it in 2026.

    python sharded_train.py --mode fsdp              # FSDP2 fully_shard, meta-device init
    python sharded_train.py --mode fsdp --init partial
    python sharded_train.py --mode tp                # DTensor tensor parallel, 2-rank mesh
    python sharded_train.py --mode hsdp              # HSDP: 4 ranks, 2 replicas of 2 shards
    python sharded_train.py --mode hsdp --drift-rank 2 --drift-step 1

fsdp: a small MLP built on the meta device, sharded with fully_shard, moved with to_empty() and
initialised by reset_parameters(). Its layer widths do not divide by 2, so FSDP2 pads every shard
and its all-gather buffers hold garbage in the other rank's slots. With --init full every
parameter is initialised: identical runs. With --init partial, reset_parameters() misses the first
layer (the bug of pytorch/examples' FSDP2 model), which then trains from whatever to_empty()'s
memory held; garbage left in the allocator beforehand makes that differ run to run.
tp: ColwiseParallel then RowwiseParallel over a 2-rank DeviceMesh: identical runs.
hsdp: fully_shard over a 2x2 mesh ("replicate", "shard"): ranks 0 and 2 hold one shard, ranks 1
and 3 the other, each rank its own data. --drift-rank R changes R's shard of fc2.bias after step
--drift-step, outside any collective, so R's replica of that shard parts from its twin's.

Each rank prints the MD5 of its shards as training starts, its loss per step, and the MD5 of its
full parameters at the end.
"""
import argparse
import hashlib
import os
import subprocess
import sys

from ports import free_port

# Imported by the ranks only (train): the parent only starts them, and importing torch there
# would cost 2 s of CPU for nothing.
np = torch = dist = nn = None


def import_torch():
    global np, torch, dist, nn
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn as nn


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def md5(t):
    return hashlib.md5(t.detach().contiguous().numpy().tobytes()).hexdigest()


def mlp():
    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(13, 7)
            self.fc2 = nn.Linear(7, 5)
            self.fc3 = nn.Linear(5, 3)

        def forward(self, x):
            return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))

    return Mlp()


def leave_garbage():
    # Freed memory that the allocator may hand to to_empty(): filled outside torch, so no
    # recorded op differs before the parameters are read.
    junk = [np.random.default_rng().random(64, dtype=np.float32) for _ in range(256)]
    del junk


def fsdp_model(init, mesh=None):
    from torch.distributed.fsdp import fully_shard
    with torch.device("meta"):
        model = mlp()
    for layer in (model.fc1, model.fc2, model.fc3):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    leave_garbage()
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    for layer in (model.fc1, model.fc2, model.fc3):
        if init == "full" or layer is not model.fc1:
            layer.reset_parameters()
    return model


def tp_model():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))
    mesh = init_device_mesh("cpu", (2,))
    return parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def hsdp_model():
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    return fsdp_model("full", mesh)


def full(p):
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def train(rank, args):
    import_torch()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    model = {"fsdp": lambda: fsdp_model(args.init), "hsdp": hsdp_model, "tp": tp_model}[args.mode]()
    # This rank's shards as training starts: what garbage, if any, it starts from. Read with
    # NumPy, not an op, so the first op to read them is still FSDP's all-gather.
    h = hashlib.md5()
    for p in model.parameters():
        h.update(getattr(p, "_local_tensor", p).data.numpy().tobytes())
    say(f"rank {rank} init {h.hexdigest()}")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # FSDP, HSDP: each rank its own data; TP: the same batch on both ranks.
    gen = torch.Generator().manual_seed(100 + (0 if args.mode == "tp" else rank))
    width = 12 if args.mode == "tp" else 13
    for step in range(args.steps):
        x, y = torch.randn(6, width, generator=gen), torch.randn(6, 3, generator=gen)
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if rank == args.drift_rank and step == args.drift_step:
            with torch.no_grad():
                model.fc2.bias._local_tensor.add_(1e-3)
        say(f"rank {rank} step {step} loss {loss.item():.9f}")
    params = torch.cat([full(p).detach().flatten() for p in model.parameters()])
    say(f"rank {rank} final {md5(params)}")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["fsdp", "hsdp", "tp"], default="fsdp")
    ap.add_argument("--init", choices=["full", "partial"], default="full")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--port", type=int, default=0, help="0: one the kernel says is free")
    ap.add_argument("--drift-rank", type=int, default=-1)
    ap.add_argument("--drift-step", type=int, default=1)
    ap.add_argument("--rank", type=int)
    args = ap.parse_args()
    args.port = args.port or free_port()
    if args.rank is not None:
        train(args.rank, args)
        return
    world = 4 if args.mode == "hsdp" else 2
    env = dict(os.environ, WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(args.port))
    procs = [subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--rank", str(r)],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(world)]
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
