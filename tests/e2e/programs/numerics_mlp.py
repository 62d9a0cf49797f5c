"""A small MLP trained a few steps on the CPU, for numerics across builds and settings.

    numerics_mlp.py [--threads N] [--tanh-gelu-at STEP] [--lr-at STEP] [--steps N] [--form FORM]
                    [--ranks 2]

--tanh-gelu-at STEP: from that step on, the second layer's activation is GELU's tanh
approximation instead of the exact one: one layer changed to another algorithm.
--lr-at STEP: from that step on, the learning rate is 0.11 instead of 0.1 (a schedule changed).
--form: how each layer is applied, the same parameters and arithmetic written three ways: the
module (`module`), `F.linear(h, W, b)` (`functional`) or `h @ W.t() + b` (`matmul`), a refactor
that runs other ops; `float64` computes the layer in double precision, other ops and other bits.
--ranks 2: two gloo ranks started by torch.multiprocessing.spawn, the layers wrapped in DDP, each
rank on its own shard. Every rank prints the MD5 of its final parameters."""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ports import free_port

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, default=1)
p.add_argument("--steps", type=int, default=4)
p.add_argument("--tanh-gelu-at", type=int, default=-1)
p.add_argument("--lr-at", type=int, default=-1)
p.add_argument("--form", choices=["module", "functional", "matmul", "float64"], default="module")
p.add_argument("--ranks", type=int, default=1)
args = p.parse_args()


def layer(layers, i, h):
    if args.form == "functional":
        return F.linear(h, layers[i].weight, layers[i].bias)
    if args.form == "matmul":
        return h @ layers[i].weight.t() + layers[i].bias
    if args.form == "float64":
        return (h.double() @ layers[i].weight.double().t() + layers[i].bias.double()).float()
    return layers[i](h)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(32, 64), torch.nn.Linear(64, 64),
                                           torch.nn.Linear(64, 10)])

    def forward(self, x, step):
        h = F.gelu(layer(self.layers, 0, x))
        tanh = 0 <= args.tanh_gelu_at <= step
        h = layer(self.layers, 1, h)
        h = F.gelu(h, approximate="tanh") if tanh else F.gelu(h)
        return layer(self.layers, 2, h)


def train(rank, port=0):
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    net = model = Net()
    if args.ranks > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=args.ranks)
        model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1 + rank)
    for step in range(args.steps):
        x = torch.randn(128, 32, generator=data)
        y = torch.randint(0, 10, (128,), generator=data)
        loss = F.cross_entropy(model(x, step), y)
        if step == args.lr_at:
            for group in opt.param_groups:
                group["lr"] = 0.11
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.6f}", flush=True)
    final = hashlib.md5(b"".join(q.detach().numpy().tobytes() for q in net.parameters()))
    print(f"rank {rank} parameters {final.hexdigest()}", flush=True)
    if args.ranks > 1:
        dist.destroy_process_group()
        # Past torch's teardown race (pytorch PR 179291): gloo's thread meeting interpreter exit
        # aborts a rank now and then. Not this program's subject.
        os._exit(0)


if __name__ == "__main__":
    if args.ranks > 1:
        # A spawned rank parses the command line again: the port is handed to it.
        torch.multiprocessing.spawn(train, args=(free_port(),), nprocs=args.ranks)
    else:
        train(0)
