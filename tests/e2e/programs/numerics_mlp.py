"""A small MLP trained a few steps on the CPU, for numerics across builds and settings.

    numerics_mlp.py [--threads N] [--tanh-gelu-at STEP] [--lr-at STEP] [--steps N] [--form FORM]
                    [--block BLOCK] [--compile] [--ranks 2]

--tanh-gelu-at STEP: from that step on, the second layer's activation is GELU's tanh
approximation instead of the exact one: one layer changed to another algorithm.
--lr-at STEP: from that step on, the learning rate is 0.11 instead of 0.1 (a schedule changed).
--form: how each layer is applied, the same parameters and arithmetic written other ways: the
module (`module`), `F.linear(h, W, b)` (`functional`), `h @ W.t() + b` (`matmul`), the weights
transposed first and `b + h @ Wt` (`reordered`), or the module with its activations applied in a
loop over the batch's chunks (`unrolled`): refactors that run other ops for the same bits.
`float64` computes the layer in double precision, other ops and other bits.
--block: after the first activation, a LayerNorm (`layernorm`) or the same written by hand
(`layernorm-by-hand`), or a single-head self-attention over 8 sequences of 16 by
`F.scaled_dot_product_attention` (`sdpa`) or written by hand (`attention-by-hand`).
--compile: the model is wrapped in torch.compile.
--ranks 2: two gloo ranks started by torch.multiprocessing.spawn, the layers wrapped in DDP (or
with --shard sharded by FSDP2's fully_shard), each rank on its own shard of the data. Every rank prints the MD5 of its final parameters."""
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
p.add_argument("--form", choices=["module", "functional", "matmul", "reordered", "unrolled", "float64"],
               default="module")
p.add_argument("--block", default="none",
               choices=["none", "layernorm", "layernorm-by-hand", "sdpa", "attention-by-hand"])
p.add_argument("--ranks", type=int, default=1)
p.add_argument("--shard", action="store_true")
p.add_argument("--compile", action="store_true")
args = p.parse_args()


def layer(layers, i, h, transposed):
    if args.form == "functional":
        return F.linear(h, layers[i].weight, layers[i].bias)
    if args.form == "matmul":
        return h @ layers[i].weight.t() + layers[i].bias
    if args.form == "reordered":
        return layers[i].bias + h @ transposed[i]
    if args.form == "float64":
        return (h.double() @ layers[i].weight.double().t() + layers[i].bias.double()).float()
    return layers[i](h)


def gelu(h, approximate="none"):
    if args.form == "unrolled":
        return torch.cat([F.gelu(chunk, approximate=approximate) for chunk in h.split(32)])
    return F.gelu(h, approximate=approximate)


def block(net, h):
    if args.block == "layernorm":
        return net.norm(h)
    if args.block == "layernorm-by-hand":
        mean = h.mean(-1, keepdim=True)
        var = ((h - mean) ** 2).mean(-1, keepdim=True)
        return (h - mean) / torch.sqrt(var + net.norm.eps) * net.norm.weight + net.norm.bias
    q = h.view(8, 16, 64)
    if args.block == "sdpa":
        return h + F.scaled_dot_product_attention(q, q, q).reshape(128, 64)
    if args.block == "attention-by-hand":
        weights = torch.softmax(q @ q.transpose(-2, -1) / 8.0, dim=-1)
        return h + (weights @ q).reshape(128, 64)
    return h


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(32, 64), torch.nn.Linear(64, 64),
                                           torch.nn.Linear(64, 10)])
        if args.block.startswith("layernorm"):
            self.norm = torch.nn.LayerNorm(64)

    def forward(self, x, step):
        transposed = [l.weight.t() for l in self.layers] if args.form == "reordered" else None
        h = block(self, gelu(layer(self.layers, 0, x, transposed)))
        tanh = 0 <= args.tanh_gelu_at <= step
        h = layer(self.layers, 1, h, transposed)
        h = gelu(h, approximate="tanh") if tanh else gelu(h)
        return layer(self.layers, 2, h, transposed)


def train(rank, port=0):
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    net = model = Net()
    if args.ranks > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=args.ranks)
        if args.shard:
            from torch.distributed.fsdp import fully_shard
            model = fully_shard(net)
        else:
            model = torch.nn.parallel.DistributedDataParallel(net)
    if args.compile:
        model = torch.compile(model)
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
    # Through torch alone: the CUDA torch's environment has no NumPy.
    flat = torch.cat([(q.full_tensor() if hasattr(q, "full_tensor") else q).detach().flatten()
                      for q in net.parameters()])
    final = hashlib.md5(bytes(flat.view(torch.uint8).tolist()))
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
