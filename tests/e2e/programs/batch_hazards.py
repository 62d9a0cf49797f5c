"""Writes, in every way an op can, bytes that an open device batch is still to digest: the very
next op in place, through a view, through `out=`, a collective in place, a nested op's output
that its enclosing kernel writes after (sum's fill_, addmm's copy_ of the bias), a matrix whose
strided column was read, fills and copies whose digests come from their value and source, and
an autograd step whose optimizer writes every parameter. Run with DETAUDIT_DEVICE_QUEUE=host, the batch holds CPU tensors across ops;
each recorded digest must be that of the bytes the op produced, as the direct path records them.

    python batch_hazards.py [--steps 3] [--big-mb 0] [--leaves-mb 0]

--big-mb N: each step also makes tensors of N MiB, so that a run holds more than a small
record.device_batch_mib.
--leaves-mb N: each step also makes a tensor of N MiB and a bit (several digest leaves, the last
one short), writes it in place right after, and reads it through a transposed view: what an MD5
batch copies whole, leaf by leaf.
"""
import argparse
import os
import tempfile

import torch
import torch.distributed as dist


def step(k, big_mb, leaves_mb):
    x = torch.arange(4096, dtype=torch.float32) * (k + 1)
    y = x * 2
    y.add_(1)                    # the very next op writes what the last one returned
    v = y[100:200]
    v.mul_(3)                    # through a view: another tensor, the same storage
    z = torch.empty(4096)
    torch.add(x, y, out=z)       # out= on a fresh buffer
    torch.mul(x, 0.5, out=z)     # out= on one the batch holds
    dist.all_reduce(z)           # a collective, in place
    m = torch.arange(2048, dtype=torch.float32).view(64, 32) * (k + 1)
    col = m[:, 3] * 2            # a strided view read (in place, by the fused kernel)...
    m.add_(1)                    # ...then its storage written
    mt = m.t() * 0.5             # a transpose read
    s = z.sum() + y.sum()        # sum fills its output with a nested fill_, then adds into it
    s = s + col.sum() + mt.sum()
    # A fill's output is digested from its value, a copy's from its source, and no batch holds
    # them: what writes them next, and what writes the source, must not change their digests.
    wide = m.view(8, 256).sum(0)  # a nested fill_ of a leaf: its value digested, not read
    tall = torch.ones(4, 4096).sum(0) * (k + 1)  # of more: read, the batch launched first
    for dtype in (torch.float16, torch.bfloat16, torch.int32, torch.int8, torch.bool,
                  torch.complex64, torch.float64):
        f = torch.empty(37, dtype=dtype).fill_(k + 1.3)  # converted as the kernel converts it
        if dtype == torch.bool:
            f.logical_not_()
        else:
            f.add_(1)
        s = s + (f.real if f.is_complex() else f).double().sum().float()
    zeroed = torch.empty(100).zero_()
    zeroed.add_(k)               # the zeros' digest stands, whatever comes next
    buf = torch.empty(64, 32)
    buf.copy_(m)                 # the source's digest, as copy_ read it
    m.mul_(2)                    # the source written after: the copy's bytes were before it
    buf.add_(1)                  # the copy written after
    half = torch.empty(64, 32).copy_(m.t().t().contiguous())  # a contiguous source
    wider = torch.empty(64, 32, dtype=torch.float64).copy_(m)  # converted: read as written
    rows = torch.empty(4, 32).copy_(m[0])  # broadcast: read as written
    half = half + wider.float() + rows.sum()
    bias = torch.arange(32, dtype=torch.float32) * (k + 1)
    lin = torch.addmm(bias, m[:4], torch.eye(32))  # the bias copied by a nested copy_
    s = s + wide.sum() + tall.sum() + zeroed.sum() + buf.sum() + half.sum() + lin.sum()
    if big_mb:
        n = big_mb * (1 << 20) // 4
        # New tensors only, none written again: the batch grows until its cap launches it.
        big = [torch.full((n,), float(i + k)) * 2 for i in range(4)]
        s = s + sum(float(b[0]) for b in big)
    if leaves_mb:
        n = leaves_mb * (1 << 20) // 4
        ramp = torch.arange(n + 7, dtype=torch.float32) * (k + 1)
        ramp.mul_(3)                                # the very next op writes what the last one returned
        cols = ramp[:n].view(64, -1).t().sin()      # read through its strides, several leaves
        s = s + float(ramp[-1]) + float(cols[1, 0])
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--big-mb", type=int, default=0)
    ap.add_argument("--leaves-mb", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(0)
    store = os.path.join(tempfile.mkdtemp(), "store")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    data = torch.randn(8, 16)
    for k in range(args.steps):
        opt.zero_grad()
        loss = net(data).pow(2).mean() + step(k, args.big_mb, args.leaves_mb) * 1e-9
        loss.backward()
        opt.step()               # writes every parameter in place
        print(f"step {k} loss {loss.item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
