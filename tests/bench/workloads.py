"""Benchmark workloads for detaudit: each times its own training steps and prints one JSON line.

  workloads.py --workload cnn|embed|lstm|gpt2|hf-gpt2 [--steps N] [--warmup N] [--threads N]
               [--peer [md5|debugmode|debugmode-norm]]

--peer runs the steps under a peer approach:
  md5 (the default): a Python TorchDispatchMode that MD5-hashes every op's tensor inputs and
    outputs (what Python-level tools do);
  debugmode: PyTorch's own DebugMode (torch 2.x prototype) with log_tensor_hashes("hash_tensor",
    hash_inputs=True), the bitwise per-op hashes of inputs and outputs;
  debugmode-norm: DebugMode with log_tensor_hashes()'s defaults, the L1 norm of each output.
"""
import argparse
import contextlib
import hashlib
import json
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class Md5EveryOp(TorchDispatchMode):
    """The peer approach: hash every tensor an op reads or writes, at every op."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def _hash(self, values):
        for v in tree_flatten(values)[0]:
            if isinstance(v, torch.Tensor) and v.layout == torch.strided and not v.is_meta:
                data = v.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if v.numel() else b""
                hashlib.md5(data).digest()
                self.bytes += len(data)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._hash((args, kwargs))
        out = func(*args, **(kwargs or {}))
        self._hash(out)
        return out


def debug_mode(peer):
    """DebugMode as its docstring shows it, logs kept: comparing runs needs them afterwards."""
    from torch.utils._debug_mode import DebugMode
    stack = contextlib.ExitStack()
    mode = stack.enter_context(DebugMode())
    if peer == "debugmode":
        stack.enter_context(DebugMode.log_tensor_hashes(hash_fn="hash_tensor", hash_inputs=True))
    else:
        stack.enter_context(DebugMode.log_tensor_hashes())
    return stack, mode


def cnn():
    torch.manual_seed(0)
    layers, c = [], 3
    for width in (32, 32, 64, 64, 128, 128):
        layers += [nn.Conv2d(c, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
        c = width
        if width in (32, 64):
            layers.append(nn.MaxPool2d(2))
    layers += [nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(128 * 16, 256), nn.ReLU(),
               nn.Dropout(0.2), nn.Linear(256, 10)]
    model = nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(32, 3, 64, 64), torch.randint(0, 10, (32,))

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def embed():
    torch.manual_seed(0)
    emb = nn.Embedding(50000, 64)
    mlp = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2))
    params = list(emb.parameters()) + list(mlp.parameters())
    opt = torch.optim.Adam(params, lr=1e-3)
    tokens, y = torch.randint(0, 50000, (256, 32)), torch.randint(0, 2, (256,))

    def step():
        opt.zero_grad()
        F.cross_entropy(mlp(emb(tokens).mean(1)), y).backward()
        opt.step()
    return step


def lstm():
    torch.manual_seed(0)
    cell, head = nn.LSTMCell(16, 32), nn.Linear(32, 1)
    opt = torch.optim.SGD(list(cell.parameters()) + list(head.parameters()), lr=0.01)
    xs, target = torch.randn(100, 4, 16), torch.randn(4, 1)

    def step():
        opt.zero_grad()
        h = c = torch.zeros(4, 32)
        for x in xs:
            h, c = cell(x, (h, c))
        F.mse_loss(head(h), target).backward()
        opt.step()
    return step


class Gpt2Block(nn.Module):
    """A GPT-2 block as Hugging Face's GPT2Block computes it: pre-LayerNorm, fused QKV, causal
    softmax attention, a 4x MLP with tanh GELU, dropout 0.1 on attention and residuals."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (d // self.heads) ** 0.5)
        att = F.dropout(F.softmax(att.masked_fill(mask, float("-inf")), dim=-1), 0.1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        x = x + F.dropout(self.proj(y), 0.1)
        return x + F.dropout(self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh")), 0.1)


def gpt2(compiled=False):
    """The shape of issue 49's Hugging Face Trainer run: 4 layers of 128, 4 heads, vocabulary
    1,024, sequence 64, batch 8, AdamW; activations and attention scores of 256 KB to 2 MB.
    compiled: the forward and the loss through torch.compile (inductor's C++ kernels)."""
    torch.manual_seed(0)
    vocab, d, seq, batch = 1024, 128, 64, 8
    wte, wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
    blocks = nn.ModuleList(Gpt2Block(d, 4) for _ in range(4))
    ln_f = nn.LayerNorm(d)
    params = [p for m in (wte, wpe, blocks, ln_f) for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3)
    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
    tokens = torch.randint(0, vocab, (batch, seq + 1))
    positions = torch.arange(seq)

    def loss_fn(tokens):
        x = F.dropout(wte(tokens[:, :-1]) + wpe(positions), 0.1)
        for block in blocks:
            x = block(x, mask)
        logits = ln_f(x) @ wte.weight.t()  # tied, as GPT-2's lm_head
        return F.cross_entropy(logits.view(-1, vocab), tokens[:, 1:].reshape(-1))

    if compiled:
        loss_fn = torch.compile(loss_fn)

    def step():
        opt.zero_grad()
        loss_fn(tokens).backward()
        opt.step()
    return step


def hf_gpt2():
    """gpt2's shape as Hugging Face builds it (GPT2LMHeadModel, built from a config, no download),
    with the optimizer its Trainer makes by default (fused AdamW on torch 2.x's CPU), stepped as
    the Trainer steps it: labels in, the model's loss backward, clipping to 1.0, step, zero_grad."""
    import tempfile
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    torch.manual_seed(0)
    vocab, seq, batch = 1024, 64, 8
    model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_head=4, n_embd=128, vocab_size=vocab,
                                       n_positions=seq, bos_token_id=0, eos_token_id=0))
    model.train()
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), use_cpu=True, report_to=[])
    opt = Trainer(model=model, args=args).create_optimizer()
    tokens = torch.randint(0, vocab, (batch, seq))

    def step():
        model(input_ids=tokens, labels=tokens).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        opt.step()
        opt.zero_grad()
    return step


def cpu_seconds():
    """User and system time of all threads: not inflated by another guest on our cores."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def thread_times():
    """Per thread of this process: (group, CPU seconds, voluntary context switches). The group is
    the main thread, detaudit's own threads by name (detaudit-writer, detaudit-md5), or "other"
    (torch's OpenMP workers and any pool). CPU time from schedstat, in ns, not clock ticks."""
    import os
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                seconds = int(f.read().split()[0]) / 1e9
            with open(f"/proc/self/task/{tid}/status") as f:
                waits = next(int(l.split()[1]) for l in f if l.startswith("voluntary_ctxt_switches"))
        except (OSError, StopIteration, ValueError):
            continue  # ended meanwhile
        group = ("main" if int(tid) == os.getpid() else comm if comm.startswith("detaudit-")
                 else "other")
        out[tid] = (group, seconds, waits)
    return out


def by_group(before, after, steps):
    """CPU ms and voluntary waits (sleeps: a futex, a lock) per step, by thread group."""
    cpu, waits = {}, {}
    for tid, (group, seconds, switches) in after.items():
        s0, w0 = before.get(tid, (group, 0.0, 0))[1:]
        cpu[group] = cpu.get(group, 0.0) + 1000 * (seconds - s0) / steps
        waits[group] = waits.get(group, 0) + (switches - w0) / steps
    return cpu, waits


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workload", choices=["cnn", "embed", "lstm", "gpt2", "gpt2-compiled", "hf-gpt2"],
                   required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--peer", nargs="?", const="md5", choices=["md5", "debugmode", "debugmode-norm"])
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    step = {"cnn": cnn, "embed": embed, "lstm": lstm, "gpt2": gpt2,
            "gpt2-compiled": lambda: gpt2(compiled=True), "hf-gpt2": hf_gpt2}[a.workload]()
    for _ in range(a.warmup):
        step()
    mode, stack = None, contextlib.ExitStack()
    if a.peer == "md5":
        mode = stack.enter_context(Md5EveryOp())
    elif a.peer:
        stack, mode = debug_mode(a.peer)
    threads0 = thread_times()
    cpu0 = cpu_seconds()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    elapsed = time.perf_counter() - t0
    cpu = cpu_seconds() - cpu0
    by_thread, waits = by_group(threads0, thread_times(), a.steps)
    stack.close()
    # DebugMode's logged calls: ops and record_function annotations alike
    calls = len(mode.logs) if a.peer in ("debugmode", "debugmode-norm") else 0
    print(json.dumps({"ms_per_step": 1000 * elapsed / a.steps,
                      "cpu_ms_per_step": 1000 * cpu / a.steps,
                      "peer_bytes_per_step": (mode.bytes / a.steps) if a.peer == "md5" else 0,
                      "peer_calls_per_step": calls / a.steps,
                      "cpu_ms_by_thread": by_thread, "waits_by_thread": waits}))


if __name__ == "__main__":
    main()
