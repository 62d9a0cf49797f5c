"""after_import(name, patch): runs patch(module) once the module `name` has been imported and
run, before the importer sees it. The module keeps its own loader (inspect and tracebacks ask it
for the source)."""
import importlib.abc
import importlib.util
import sys


def after_import(name, patch):
    sys.meta_path.insert(0, _Finder(name, patch))


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, name, patch):
        self._name, self._patch = name, patch

    def find_spec(self, name, path=None, target=None):
        if name != self._name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, self._patch)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    """The module's own loader, which patches the module once it ran; then the module's loader
    is its own again."""

    def __init__(self, loader, patch):
        self._loader, self._patch = loader, patch

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._patch(module)
