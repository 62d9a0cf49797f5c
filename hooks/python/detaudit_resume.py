"""`detaudit resume`: stops Hugging Face Trainer or Lightning at step K with its own checkpoint,
then resumes it from there, with no change to the program. Active only when DETAUDIT_RESUME is
"stop" or "resume"; DETAUDIT_RESUME_AT is K, DETAUDIT_RESUME_CKPT a directory of the run's
(`detaudit resume --out`) that holds the checkpoint: the resumed process reads it from there,
not from a path the program computes again (a Trainer's output_dir may be a new temp dir)."""
import importlib
import importlib.abc
import importlib.machinery
import os
import shutil
import sys

MODE = os.environ.get("DETAUDIT_RESUME", "")
AT = int(os.environ.get("DETAUDIT_RESUME_AT", "0") or 0)
CKPT = os.environ.get("DETAUDIT_RESUME_CKPT", "")
TRAINER_CHECKPOINT = os.path.join(CKPT, "trainer")
LIGHTNING_CHECKPOINT = os.path.join(CKPT, "lightning.ckpt")


def _saved(path):
    """The checkpoint the stopped process left, or a one-line error and exit 2."""
    if not os.path.exists(path):
        sys.stderr.write(f"detaudit: the stopped run left no checkpoint at {path}: it never "
                         f"reached step {AT}; give --at a step the program reaches\n")
        sys.exit(2)
    return path


def _patch_transformers(module):
    from transformers import TrainerCallback

    class StopAndSave(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= AT:
                control.should_save = True
                control.should_training_stop = True

        def on_save(self, args, state, control, **kwargs):
            # Trainer has written checkpoint-<step> into its output_dir: a copy of it in the run
            # directory is what the resumed process loads.
            if state.global_step >= AT and state.is_world_process_zero:
                saved = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
                shutil.rmtree(TRAINER_CHECKPOINT, ignore_errors=True)
                shutil.copytree(saved, TRAINER_CHECKPOINT)

    trainer = module.Trainer
    init, train = trainer.__init__, trainer.train

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if MODE == "stop":
            self.add_callback(StopAndSave())

    def train_(self, resume_from_checkpoint=None, *args, **kwargs):
        # None, or True (the last checkpoint in output_dir): the stopped run's. A path the program
        # names is its own choice.
        if MODE == "resume" and resume_from_checkpoint in (None, True):
            resume_from_checkpoint = _saved(TRAINER_CHECKPOINT)
        return train(self, resume_from_checkpoint, *args, **kwargs)

    trainer.__init__, trainer.train = __init__, train_


def _patch_lightning(module, package):
    callback = importlib.import_module(package + ".callbacks").Callback

    class StopAndSave(callback):
        def on_train_batch_end(self, trainer, *args, **kwargs):
            if trainer.global_step >= AT and not trainer.should_stop:
                trainer.save_checkpoint(LIGHTNING_CHECKPOINT)
                trainer.should_stop = True

    trainer = module.Trainer
    init, fit = trainer.__init__, trainer.fit

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if MODE == "stop":
            self.callbacks.append(StopAndSave())

    def fit_(self, *args, **kwargs):
        if MODE == "resume" and len(args) < 5 and kwargs.get("ckpt_path") is None:
            kwargs["ckpt_path"] = _saved(LIGHTNING_CHECKPOINT)
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
