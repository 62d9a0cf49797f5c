"""The ways users step an optimizer, one cell each, one after the other in one process: the step
recall matrix of tests/e2e/test_stepping.py.

    python stepping_matrix.py [--steps 4] [--plant-step 2] [--plant-run run-1] [--cells a,b]

Each cell is a small MLP seeded afresh. In the run whose run directory (DETAUDIT_RUN_DIR) ends in
--plant-run, one gradient element is scaled by 1.001 at the cell's iteration --plant-step, by the
same op every run runs (its factor a tensor, 1.0 in the other runs, so compiled code is the same
graph in every run). Prints `cell NAME steps FIRST-LAST planted STEP` (global steps as detaudit
counts them: one per optimizer step, every optimizer's) or `cell NAME skipped: WHY`, then a
checksum of each cell's final parameters.
"""
import argparse
import hashlib
import importlib.util
import os

import torch

HAS_COMPILE = hasattr(torch, "compile")
STEPS = 4  # iterations a cell runs (--steps)
LIBRARIES = {"accelerate": "accelerate", "lightning-manual": "lightning",
             "trainer-compiled": "transformers"}


def model():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def plant(net, factor):
    net[0].weight.grad.view(-1)[3:4].mul_(factor)


def eager(net, x, y, factor, opt=None):
    opt = opt or torch.optim.Adam(net.parameters(), lr=1e-2)

    def step(f):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        plant(net, f)
        opt.step()
    return step, 1


def compiled_opt_step(net, x, y, factor, fullgraph=False):
    """PyTorch's recipe "Compiling the optimizer with torch.compile"."""
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)

    @torch.compile(fullgraph=fullgraph)
    def opt_step():
        opt.step()

    def step(f):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        plant(net, f)
        opt_step()
    return step, 1


def compiled_train_step(net, x, y, factor):
    """Forward, backward and step in one compiled function."""
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)

    @torch.compile
    def train_step(x, y, f):
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        plant(net, f)
        opt.step()
        opt.zero_grad()
        return loss.detach()

    return (lambda f: train_step(x, y, f)), 1


def compiled_model(net, x, y, factor, **impl):
    """torch.compile(model) with a fused or foreach optimizer, stepped eagerly."""
    compiled = torch.compile(net)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, **impl)

    def step(f):
        opt.zero_grad()
        torch.nn.functional.mse_loss(compiled(x), y).backward()
        plant(net, f)
        opt.step()
    return step, 1


def lbfgs(net, x, y, factor):
    opt = torch.optim.LBFGS(net.parameters(), lr=0.5, max_iter=3)

    def step(f):
        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            plant(net, f)
            return loss
        opt.step(closure)
    return step, 1


def two_optimizers(net, x, y, factor):
    """A GAN's shape: two optimizers step in each iteration; the first one's gradient planted."""
    first = torch.optim.Adam(net[0].parameters(), lr=1e-2)
    second = torch.optim.SGD(net[2].parameters(), lr=0.05)

    def step(f):
        first.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        plant(net, f)
        first.step()
        second.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        second.step()
    return step, 2


def accelerate_loop(net, x, y, factor):
    """Hugging Face accelerate: prepare(), accelerator.backward(), the wrapped optimizer's step."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model, opt = accelerator.prepare(net, torch.optim.Adam(net.parameters(), lr=1e-2))

    def step(f):
        opt.zero_grad()
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        plant(net, f)
        opt.step()
    return step, 1


def lightning_manual(net, x, y, factor):
    """Lightning's manual optimization: self.optimizers(), manual_backward(), its step; the
    Trainer's loop runs every iteration, in the last call."""
    import lightning.pytorch as pl

    factors = []

    class Manual(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net
            self.automatic_optimization = False

        def training_step(self, batch, index):
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(torch.nn.functional.mse_loss(self.net(batch[0]), batch[1]))
            plant(self.net, factors[index])
            opt.step()

        def configure_optimizers(self):
            return torch.optim.Adam(self.net.parameters(), lr=1e-2)

    def step(f):
        factors.append(f)
        if len(factors) < STEPS:
            return
        trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False)
        trainer.fit(Manual(), torch.utils.data.DataLoader([(x, y)] * STEPS, batch_size=None))
    return step, 1


def trainer_compiled(net, x, y, factor):
    """Hugging Face's Trainer with `torch_compile=True` (its default optimizer, AdamW); the
    gradient planted after its training_step's backward."""
    import tempfile

    from transformers import Trainer, TrainingArguments

    class Regression(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x, labels):
            return {"loss": torch.nn.functional.mse_loss(self.net(x), labels)}

    factors = []

    class Planting(Trainer):
        def training_step(self, *args, **kwargs):
            loss = super().training_step(*args, **kwargs)
            plant(net, factors[self.state.global_step])
            return loss

    def step(f):
        factors.append(f)
        if len(factors) < STEPS:
            return
        with tempfile.TemporaryDirectory() as out:
            args = TrainingArguments(out, max_steps=STEPS, per_device_train_batch_size=len(x),
                                     learning_rate=1e-2, max_grad_norm=0.0, torch_compile=True,
                                     use_cpu=True, report_to=[], save_strategy="no",
                                     logging_strategy="no", disable_tqdm=True)
            data = [{"x": x[i], "labels": y[i]} for i in range(len(x))] * STEPS
            Planting(model=Regression(), args=args, train_dataset=data).train()
    return step, 1


CELLS = [
    ("eager", eager, False),
    ("compiled-opt-step", compiled_opt_step, True),
    ("compiled-train-step", compiled_train_step, True),
    ("compiled-model-fused", lambda *a: compiled_model(*a, fused=True), True),
    ("compiled-model-foreach", lambda *a: compiled_model(*a, foreach=True), True),
    ("lbfgs", lbfgs, False),
    ("two-optimizers", two_optimizers, False),
    ("accelerate", accelerate_loop, False),
    ("lightning-manual", lightning_manual, False),
    ("trainer-compiled", trainer_compiled, True),
    # Last: where torch refuses it (torch.optim breaks the graph in _use_grad), what its trace
    # noted stays behind.
    ("compiled-opt-step-fullgraph", lambda *a: compiled_opt_step(*a, fullgraph=True), True),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--plant-step", type=int, default=2)
    ap.add_argument("--plant-run", default="run-1")
    ap.add_argument("--cells", default="")
    args = ap.parse_args()
    global STEPS
    STEPS = args.steps
    wanted = set(args.cells.split(",")) if args.cells else None
    run = os.path.basename(os.environ.get("DETAUDIT_RUN_DIR", "").rstrip("/"))
    planting = run == args.plant_run
    torch.set_num_threads(1)
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    y = torch.randn(32, 4, generator=torch.Generator().manual_seed(2))
    step = 0  # detaudit's step: one per optimizer step
    sums = []
    for index, (name, make, compiles) in enumerate(CELLS):
        if wanted is not None and name not in wanted:
            continue
        if compiles and not HAS_COMPILE:
            print(f"cell {name} skipped: torch {torch.__version__} has no torch.compile")
            continue
        if name in LIBRARIES and importlib.util.find_spec(LIBRARIES[name]) is None:
            print(f"cell {name} skipped: {LIBRARIES[name]} is not installed")
            continue
        torch.manual_seed(100 + index)
        net = model()
        first = step
        try:
            train, per_iteration = make(net, x, y, None)
            for k in range(args.steps):
                train(torch.tensor(1.001 if planting and k == args.plant_step else 1.0))
                step += per_iteration
        except Exception as e:  # a way of stepping this torch refuses (fullgraph: torch.optim
            # breaks the graph itself in _use_grad)
            if k > 0:
                raise
            print(f"cell {name} skipped: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            step = first
            continue
        print(f"cell {name} steps {first}-{step - 1} planted {first + args.plant_step * per_iteration}")
        sums.append(hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                            for p in net.parameters())).hexdigest()[:16])
    print("params sha256 " + hashlib.sha256(" ".join(sums).encode()).hexdigest())


if __name__ == "__main__":
    main()
