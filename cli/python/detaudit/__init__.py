"""detaudit, installed with pip: the compiled CLI and interposers live in this package."""
import os

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def executable():
    """The compiled `detaudit` CLI of this installation."""
    return os.path.join(PACKAGE_DIR, "bin", "detaudit")
