"""What the GPU test programs share: the command line, seeding, and a checksum of a CUDA tensor's
bits that the tests compare between runs (the ground truth for "the runs differed").

Imported by the programs beside it (their own folder is on sys.path when they run).
"""
import argparse
import os

# cuBLAS is deterministic only with a fixed workspace; set before torch loads, so that nothing
# but the op under test can make two runs differ.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402


def parse_args(description, steps=2):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--deterministic", action="store_true",
                    help="torch.use_deterministic_algorithms(True) before anything runs")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    torch.manual_seed(0)  # seeds CUDA's generators too
    torch.backends.cudnn.benchmark = False
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
    return args


def data(*shape, low=None, high=None, dtype=torch.float32, seed=0):
    """A tensor made on the CPU from its own seeded generator, then moved to the GPU."""
    g = torch.Generator().manual_seed(seed)
    if low is not None:
        t = torch.randint(low, high, shape, generator=g, dtype=torch.long)
    else:
        t = torch.randn(*shape, generator=g, dtype=dtype)
    return t.cuda()


def checksum(t):
    """Two int64 sums over the tensor's 32-bit words: every bit counts, and integer sums on the
    GPU are exact, so equal bits give equal text on every run. (No copy of the tensor to the
    host, and no NumPy needed.)"""
    b = t.detach().contiguous().view(-1)
    if b.element_size() != 4:
        b = b.float()
    w = b.view(torch.int32).to(torch.int64)
    i = torch.arange(w.numel(), device=w.device, dtype=torch.int64)
    return f"{int((w * (2 * i + 1)).sum()) & (2**64 - 1):016x}{int((w ^ (i * 0x9E3779B1)).sum()) & (2**64 - 1):016x}"


def train(args, params, step_fn, what):
    """Runs args.steps SGD steps. step_fn() returns (loss, probe); probe() is called after the
    backward pass and returns the tensor the op under test wrote (its output, or the gradient
    it made), whose checksum is printed as `step K WHAT checksum C`."""
    opt = torch.optim.SGD(params, lr=1e-3)
    for step in range(args.steps):
        opt.zero_grad(set_to_none=True)
        loss, probe = step_fn()
        loss.backward()
        print(f"step {step} {what} checksum {checksum(probe())}", flush=True)
        opt.step()
    torch.cuda.synchronize()
    print(f"final loss {loss.item():.9e}")
