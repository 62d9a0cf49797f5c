"""`detaudit resume`: stops Hugging Face Trainer or Lightning at step K with its own checkpoint,
then resumes it from there, with no change to the program. Active only when DETAUDIT_RESUME is
"stop" or "resume"; DETAUDIT_RESUME_AT is K, DETAUDIT_RESUME_CKPT Lightning's checkpoint file
(Trainer writes checkpoint-K into its output_dir, and resumes from that one)."""
import importlib
import importlib.abc
import importlib.machinery
import os
import sys

MODE = os.environ.get("DETAUDIT_RESUME", "")
AT = int(os.environ.get("DETAUDIT_RESUME_AT", "0") or 0)
CKPT = os.environ.get("DETAUDIT_RESUME_CKPT", "")


def _patch_transformers(module):
    from transformers import TrainerCallback

    class StopAndSave(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= AT:
                control.should_save = True
                control.should_training_stop = True

    trainer = module.Trainer
    init, train = trainer.__init__, trainer.train

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if MODE == "stop":
            self.add_callback(StopAndSave())

    def train_(self, resume_from_checkpoint=None, *args, **kwargs):
        if MODE == "resume" and resume_from_checkpoint is None:
            # The stopped run's checkpoint, by name: the run that went through may have left
            # later ones in the same output_dir.
            resume_from_checkpoint = os.path.join(self.args.output_dir, f"checkpoint-{AT}")
        return train(self, resume_from_checkpoint, *args, **kwargs)

    trainer.__init__, trainer.train = __init__, train_


def _patch_lightning(module, package):
    callback = importlib.import_module(package + ".callbacks").Callback

    class StopAndSave(callback):
        def on_train_batch_end(self, trainer, *args, **kwargs):
            if trainer.global_step >= AT and not trainer.should_stop:
                trainer.save_checkpoint(CKPT)
                trainer.should_stop = True

    trainer = module.Trainer
    init, fit = trainer.__init__, trainer.fit

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if MODE == "stop":
            self.callbacks.append(StopAndSave())

    def fit_(self, *args, **kwargs):
        if MODE == "resume" and len(args) < 5 and kwargs.get("ckpt_path") is None:
            kwargs["ckpt_path"] = CKPT
        return fit(self, *args, **kwargs)

    trainer.__init__, trainer.fit = __init__, fit_


_PATCHES = {
    "transformers.trainer": _patch_transformers,
    "lightning.pytorch.trainer.trainer": lambda m: _patch_lightning(m, "lightning.pytorch"),
    "pytorch_lightning.trainer.trainer": lambda m: _patch_lightning(m, "pytorch_lightning"),
}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches each module of _PATCHES once it has run."""

    def find_spec(self, name, path, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def install():
    if MODE in ("stop", "resume"):
        sys.meta_path.insert(0, _PatchOnImport())
