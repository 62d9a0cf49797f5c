"""A tiny GPT-2 trained by Hugging Face's Trainer with its default optimizer (fused AdamW on
torch 2.x's CPU), built from a config (no download). From step --race-from on, the loss gains a
term over a gathered table (`table[idx]`) whose backward is CPU `index_put_` with accumulate=True
on 2 threads: a race on float atomics, so the runs' parameters part there.

    python hf_trainer.py [--steps 60] [--race-from 50] [--threads 2] [--attention eager|sdpa]

--attention: GPT-2's attention as transformers' eager code (its causal mask built first, then
matmul, softmax, matmul) or by `F.scaled_dot_product_attention` (transformers' default): the same
model refactored.

Prints the optimizer Trainer made (`optimizer AdamW fused=True`) and a checksum of the final
parameters (`params sha256 ...`).
"""
import argparse
import hashlib
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class RacyGPT2(torch.nn.Module):
    """GPT-2 whose loss, from step `race_from`, adds a term over rows gathered by index."""

    def __init__(self, race_from, attention=None):
        super().__init__()
        config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=32,
                            **({"attn_implementation": attention} if attention else {}))
        self.gpt2 = GPT2LMHeadModel(config)
        self.table = torch.nn.Parameter(torch.randn(64, 32))
        self.race_from = race_from
        self.calls = 0
        g = torch.Generator().manual_seed(7)
        # 160,000 rows: the backward's index_put adds for over 10 ms, so its two threads
        # interleave even on a loaded machine (at 40,000 one often ran before the other).
        self.register_buffer("idx", torch.randint(0, 64, (160000,), generator=g), persistent=False)
        self.register_buffer("weights", torch.randn(160000, 32, generator=g), persistent=False)

    def forward(self, input_ids, labels=None, **kwargs):
        out = self.gpt2(input_ids=input_ids, labels=labels)
        loss = out.loss
        if self.training:
            if self.calls >= self.race_from:
                loss = loss + 1e-3 * (self.table[self.idx] * self.weights).sum()
            self.calls += 1
        return {"loss": loss, "logits": out.logits}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--race-from", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--attention", choices=["eager", "sdpa"])
    ap.add_argument("--out", default=os.environ.get("DETAUDIT_RUN_DIR", ".") + "/trainer-out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = RacyGPT2(args.race_from, args.attention)
    data = [{"input_ids": torch.randint(0, 128, (16,)), "labels": None} for _ in range(64)]
    for d in data:
        d["labels"] = d["input_ids"].clone()
    training = TrainingArguments(output_dir=args.out, max_steps=args.steps,
                                 per_device_train_batch_size=4, learning_rate=1e-3,
                                 save_strategy="no", report_to=[], logging_strategy="no",
                                 use_cpu=True, seed=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=training, train_dataset=data)
    trainer.train()
    opt = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
    print(f"optimizer {type(opt).__name__} fused={opt.defaults.get('fused')}")
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    print("params sha256 " + h.hexdigest())


if __name__ == "__main__":
    main()
