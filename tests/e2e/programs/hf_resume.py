"""A tiny GPT-2 (dropout on) trained by Hugging Face's Trainer, which saves a checkpoint at step
--save-at: run through (--steps), stopped there (--stop), or resumed from that checkpoint with
Trainer's own resume_from_checkpoint (--resume). Built from a config: no download. Without --out
its output_dir is a new temp dir, as in notebooks and tests: a resumed process cannot find the
stopped one's checkpoint by its path. --evaluate logs and evaluates every 2 steps.

    hf_resume.py [--out DIR] [--steps 8] [--save-at 4] [--evaluate] [--save-only-model]
                 [--stop | --resume]

--save-only-model saves checkpoints with TrainingArguments(save_only_model=True), as users do to
save disk: the model alone, without the optimizer's, scheduler's or generators' state.

Prints a checksum of the final parameters (`params sha256 ...`).
"""
import argparse
import hashlib
import os
import tempfile

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,
                          TrainingArguments)


class StopAt(TrainerCallback):
    """Stops training after `step`, once its checkpoint is saved (save_steps = step)."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True
        return control


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--save-at", type=int, default=4)
    ap.add_argument("--evaluate", action="store_true")
    ap.add_argument("--save-only-model", action="store_true")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--stop", action="store_true")
    mode.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=32)
    model = GPT2LMHeadModel(config)
    g = torch.Generator().manual_seed(1)
    data = [{"input_ids": torch.randint(0, 128, (16,), generator=g)} for _ in range(64)]
    for d in data:
        d["labels"] = d["input_ids"].clone()
    out = args.out or tempfile.mkdtemp(prefix="hf_resume_")
    every = {"logging_strategy": "steps", "logging_steps": 2, "eval_strategy": "steps",
             "eval_steps": 2} if args.evaluate else {"logging_strategy": "no"}
    training = TrainingArguments(output_dir=out, max_steps=args.steps,
                                 per_device_train_batch_size=4, learning_rate=1e-3,
                                 save_strategy="steps", save_steps=args.save_at, report_to=[],
                                 use_cpu=True, seed=0, disable_tqdm=True,
                                 save_only_model=args.save_only_model, **every)
    callbacks = [StopAt(args.save_at)] if args.stop else []
    trainer = Trainer(model=model, args=training, train_dataset=data,
                      eval_dataset=data[:8] if args.evaluate else None, callbacks=callbacks)
    checkpoint = os.path.join(out, f"checkpoint-{args.save_at}")
    trainer.train(resume_from_checkpoint=checkpoint if args.resume else None)
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    print("params sha256 " + h.hexdigest())


if __name__ == "__main__":
    main()
