"""Lightning's Trainer stopped after its first epoch and resumed with fit(ckpt_path=...), as users
do (tests/e2e/test_resume.py): an MLP with dropout, SGD with momentum, a shuffled DataLoader,
4 steps an epoch, 2 epochs.

    lightning_resume.py --out DIR [--stop | --resume] [--save-rng] [--manual] [--model-checkpoint]

--stop saves Lightning's own checkpoint at the end of the first epoch (DIR/epoch1.ckpt) and
stops; --resume fits again from it. Neither flag runs both epochs through. Lightning's checkpoint
does not hold torch's generator; --save-rng adds it in the module's on_save_checkpoint and
restores it in on_load_checkpoint. --manual optimizes by hand (automatic_optimization off,
manual_backward, the optimizer's step and zero_grad in training_step). --model-checkpoint adds a
ModelCheckpoint saving every 2 steps, and the last, into a new temp dir in each process.
"""
import argparse
import os
import tempfile

import lightning as L
import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
g = p.add_mutually_exclusive_group()
g.add_argument("--stop", action="store_true")
g.add_argument("--resume", action="store_true")
p.add_argument("--save-rng", action="store_true")
p.add_argument("--manual", action="store_true")
p.add_argument("--model-checkpoint", action="store_true")
args = p.parse_args()
os.makedirs(args.out, exist_ok=True)
ckpt = os.path.join(args.out, "epoch1.ckpt")


class Mlp(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.25), nn.Linear(32, 1))
        self.automatic_optimization = not args.manual

    def training_step(self, batch, _):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        if args.manual:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    def on_save_checkpoint(self, checkpoint):
        if args.save_rng:
            checkpoint["torch_rng"] = torch.get_rng_state()

    def on_load_checkpoint(self, checkpoint):
        if args.save_rng:
            torch.set_rng_state(checkpoint["torch_rng"])


class StopAfterFirstEpoch(L.Callback):
    def on_train_epoch_end(self, trainer, module):
        trainer.save_checkpoint(ckpt)
        trainer.should_stop = True


L.seed_everything(0, workers=True)
torch.set_num_threads(1)
data = torch.utils.data.TensorDataset(torch.randn(32, 8, generator=torch.Generator().manual_seed(1)),
                                      torch.randn(32, 1, generator=torch.Generator().manual_seed(2)))
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
callbacks = [StopAfterFirstEpoch()] if args.stop else []
if args.model_checkpoint:
    callbacks.append(L.pytorch.callbacks.ModelCheckpoint(
        dirpath=tempfile.mkdtemp(), every_n_train_steps=2, save_last=True))
trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False,
                    enable_checkpointing=args.model_checkpoint, enable_progress_bar=False,
                    enable_model_summary=False, callbacks=callbacks)
trainer.fit(Mlp(), loader, ckpt_path=ckpt if args.resume else None)
print(f"global_step {trainer.global_step}")
