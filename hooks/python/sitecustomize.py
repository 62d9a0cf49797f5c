"""Loaded at interpreter start in the programs `detaudit run` launches (it puts this folder first
on PYTHONPATH): records the kernels torch.compile runs (compiled_kernels.py), keeps compiled
optimizer steps marked (optimizer_steps.py), notes NumPy's and Python's generators at each step's
end (python_generators.py), shows a sentinel each backward's loss
(backward_mark.py), and stops and resumes Trainer or Lightning for `detaudit resume`
(detaudit_resume.py). A sitecustomize this one shadows, the user's or the
distribution's, is run too."""
import importlib.util
import os
import sys


def _run_shadowed():
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        path = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_detaudit_shadowed_sitecustomize", path)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


try:
    _run_shadowed()
finally:
    if os.environ.get("DETAUDIT_RUN_DIR"):
        import detaudit_backward_mark
        import detaudit_compiled_kernels
        import detaudit_final_state
        import detaudit_optimizer_steps
        import detaudit_python_generators
        import detaudit_resume

        detaudit_compiled_kernels.install()
        detaudit_final_state.install()
        detaudit_optimizer_steps.install()
        detaudit_python_generators.install()
        detaudit_resume.install()
        if detaudit_backward_mark.wanted():
            detaudit_backward_mark.install()
