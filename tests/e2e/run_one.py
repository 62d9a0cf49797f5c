"""One end-to-end test (FILE.CLASS[.METHOD]) under the environment ctest gives FILE for pip's
torch: for CI's stages after the main ctest (.ci/run runs test_numerics.AgainstTheCudaTorch once
the CUDA build has made its interposer).

    python3 tests/e2e/run_one.py test_numerics.AgainstTheCudaTorch
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    name = sys.argv[1]
    file = name.split(".")[0]
    listing = subprocess.run(["ctest", "--show-only=json-v1"], cwd=os.path.join(ROOT, "build"),
                             capture_output=True, text=True, check=True)
    tests = [t for t in json.loads(listing.stdout)["tests"]
             if t["name"].startswith("e2e.torch_2") and t["name"].endswith("." + file)]
    if not tests:
        sys.exit(f"run_one: build/ has no end-to-end test {file} under torch 2 (tests/build.sh)")
    props = {p["name"]: p["value"] for p in tests[0]["properties"]}
    env = dict(os.environ, **dict(kv.split("=", 1) for kv in props["ENVIRONMENT"]))
    command = tests[0]["command"][:-1] + [name]  # python -m unittest -v FILE -> the one named
    sys.exit(subprocess.call(command, env=env, cwd=props["WORKING_DIRECTORY"]))


if __name__ == "__main__":
    main()
