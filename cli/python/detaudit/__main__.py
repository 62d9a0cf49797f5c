"""`detaudit ...` and `python -m detaudit ...`: the compiled CLI, with the same arguments."""
import os
import sys

from detaudit import executable


def main():
    cli = executable()
    if not os.access(cli, os.X_OK):
        sys.stderr.write(f"detaudit: error: {cli} is missing: reinstall with "
                         "`pip install --no-build-isolation .` from the detaudit source\n")
        return 2
    os.execv(cli, [cli] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
