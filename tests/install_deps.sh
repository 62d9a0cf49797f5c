#!/usr/bin/env bash
# Installs what detaudit needs from Debian 12, skipping what is already there.
#   tests/install_deps.sh [extra-package...]   (the benchmark adds valgrind)
set -euo pipefail
packages=(build-essential cmake ninja-build pkg-config
          libtorch-dev python3-torch python3-numpy
          nlohmann-json3-dev libcli11-dev libfmt-dev libssl-dev libxxhash-dev libgtest-dev "$@")
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
