#!/usr/bin/env bash
# Installs what detaudit needs on Debian 12, skipping what is already there:
# - the build tools and libraries, from Debian;
# - a virtual environment, <source>/.venv, with pip's torch 2.13.0 (CPU), the torch users have;
# - with --debian-torch, Debian's libtorch 1.13 and its python3-torch: the other end of the
#   supported range, which the tests cover too.
# - with --training-loops, the training loops users run, in that environment: Hugging Face's
#   transformers with accelerate (Trainer) and Lightning, for the tests that audit them.
#   tests/install_deps.sh [--debian-torch] [--training-loops] [extra-debian-package...]
#   (the benchmark adds valgrind)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
packages=(build-essential cmake ninja-build pkg-config python3 python3-venv
          nlohmann-json3-dev libcli11-dev libfmt-dev libssl-dev libxxhash-dev libgtest-dev)
loops=0
for a in "$@"; do
  case $a in
    --debian-torch) packages+=(libtorch-dev python3-torch python3-numpy);;
    --training-loops) loops=1;;
    *) packages+=("$a");;
  esac
done
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "detaudit: installing ${missing[*]}" >&2
  sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  # With recommends: the set every test here ran against.
  "${sudo_cmd[@]}" apt-get install -y -q "${missing[@]}"
fi

# Pinned: an open range would pull a CUDA build of several GB.
venv="$root/.venv"
if ! "$venv/bin/python" -c 'import torch, numpy, scikit_build_core, pytest; assert torch.__version__.startswith("2.13.0")' \
     2>/dev/null; then
  echo "detaudit: creating $venv with torch 2.13.0" >&2
  python3 -m venv "$venv" 2>/dev/null || /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check torch==2.13.0 numpy==2.4.6 \
    scikit-build-core==1.1.2 pytest==8.3.3
fi
# Pinned, beside torch 2.13.0, which they keep (about 55 s and 170 MB).
if ((loops)) && ! "$venv/bin/python" -c 'import transformers, accelerate, lightning' 2>/dev/null; then
  echo "detaudit: installing transformers, accelerate and lightning into $venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check transformers==5.24.0 accelerate==1.15.0 \
    lightning==2.6.6 torch==2.13.0
fi
