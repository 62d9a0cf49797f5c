"""Step time of a CUDA model, for plain-vs-recorded figures: a small CNN and transformer, and two
of real size, a ResNet-50 (torchvision, batch 64, 224x224, channels_last) and a GPT-2-small-shaped
transformer (12 layers of 768, 12 heads, sequence 1024, batch 8), both under bf16 autocast. Prints one line
`BENCH {json}`: median and mean step milliseconds over the timed steps (each step ends with a
synchronize, so a step's time includes everything the recorder made the GPU do), and, with
--count-bytes, the bytes the ops of one step wrote (what a recorder must digest), counted in an
extra untimed step, plus the GPU's device-to-device copy bandwidth for scale. With
--deterministic, torch's deterministic algorithms; the line then also holds a checksum of the
final parameters' bits, which a recorded run must leave unchanged."""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode


def cnn():
    def block(i, o):
        return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())
    model = nn.Sequential(block(3, 32), block(32, 32), nn.MaxPool2d(2), block(32, 64),
                          block(64, 64), nn.MaxPool2d(2), block(64, 128), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(128, 10))
    x = torch.randn(64, 3, 32, 32)
    y = torch.randint(0, 10, (64,))
    return model, x, y, nn.functional.cross_entropy


def transformer():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(1000, 256)
            layer = nn.TransformerEncoderLayer(256, 8, 1024, dropout=0.0, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 4)
            self.head = nn.Linear(256, 1000)

        def forward(self, tokens):
            return self.head(self.enc(self.emb(tokens)))
    x = torch.randint(0, 1000, (16, 128))
    y = torch.randint(0, 1000, (16, 128))

    def loss(out, target):
        return nn.functional.cross_entropy(out.reshape(-1, 1000), target.reshape(-1))
    return Net(), x, y, loss


def resnet50():
    import torchvision
    model = torchvision.models.resnet50(num_classes=1000).to(memory_format=torch.channels_last)
    x = torch.randn(64, 3, 224, 224).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (64,))
    return model, x, y, nn.functional.cross_entropy


def gpt2_small():
    vocab, width, layers, heads, seq = 50257, 768, 12, 12, 1024

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                     nn.Linear(4 * width, width))
            self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1))

        def forward(self, x):
            h = self.ln1(x)
            mask = self.mask[:x.shape[1], :x.shape[1]]
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.ln = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab, bias=False)

        def forward(self, tokens):
            pos = torch.arange(tokens.shape[1], device=tokens.device)
            return self.head(self.ln(self.blocks(self.tok(tokens) + self.pos(pos))))
    x = torch.randint(0, vocab, (8, seq))
    y = torch.randint(0, vocab, (8, seq))

    def loss(out, target):
        return nn.functional.cross_entropy(out.reshape(-1, vocab).float(), target.reshape(-1))
    return Net(), x, y, loss


MODELS = {"cnn": cnn, "transformer": transformer, "resnet50": resnet50, "gpt2": gpt2_small}
AUTOCAST = {"resnet50", "gpt2"}  # bf16, as such models train


class CountBytes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        for t in (out if isinstance(out, (list, tuple)) else [out]):
            if isinstance(t, torch.Tensor) and t.is_cuda:
                self.bytes += t.numel() * t.element_size()
        return out


def copy_bandwidth_gbs():
    a = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    torch.cuda.synchronize()
    return 2 * 10 * a.numel() / (time.perf_counter() - t0) / 1e9  # read + write


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--count-bytes", action="store_true")
    ap.add_argument("--deterministic", action="store_true")
    args = ap.parse_args()
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read at cuBLAS's first use
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    model, x, y, loss_fn = MODELS[args.model]()
    model, x, y = model.cuda(), x.cuda(), y.cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.model in AUTOCAST):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        return loss

    times = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        loss = step()
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    result = {"model": args.model, "steps": args.steps, "warmup": args.warmup,
              "median_ms": statistics.median(times), "mean_ms": statistics.fmean(times),
              "min_ms": min(times), "final_loss": loss.item(),
              "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "parameters": sum(p.numel() for p in model.parameters())}
    if args.deterministic:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from gpu_common import checksum
        result["params_checksum"] = checksum(torch.cat([p.detach().reshape(-1)
                                                        for p in model.parameters()]))
    if args.count_bytes:
        with CountBytes() as counter:
            step()
        result.update(ops_per_step=counter.ops, output_bytes_per_step=counter.bytes,
                      copy_bandwidth_gbs=copy_bandwidth_gbs())
    print("BENCH " + json.dumps(result))


if __name__ == "__main__":
    main()
