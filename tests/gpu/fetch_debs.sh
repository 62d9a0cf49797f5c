#!/usr/bin/env bash
# Run HERE (Debian 12, apt works), not on the GPU machine: downloads the Debian packages that
# building detaudit needs and the GPU machine lacks (it has no package registry) into <source>/.deb/,
# which tests/gpu/run.sh unpacks into a prefix of its own (dpkg -x, never into /).
#   tests/gpu/fetch_debs.sh [--pytest]   # --pytest: also pytest's wheels into .whl/ (cp312)
# Then name .deb (and .whl) in the device tool's `carry` and run `bash tests/gpu/run.sh` there.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# What tests/install_deps.sh installs from Debian, minus what the GPU image has (compiler, cmake,
# Python), plus each -dev package's runtime library: CMake's imported targets check that the
# .so they name exists. pkgconf and ninja are fallbacks for an image without them.
packages=(libssl-dev libssl3 libxxhash-dev libxxhash0 libfmt-dev libfmt9 nlohmann-json3-dev
          libcli11-dev libgtest-dev pkgconf-bin libpkgconf3 ninja-build)
# Dependencies any x86-64 glibc system already has; everything else must be in the list above.
assumed=" libc6 libstdc++6 libgcc-s1 gcc-12-base debconf googletest "

mkdir -p "$root/.deb"
# The closure check: a dependency that is neither listed nor assumed would be missing there.
for p in "${packages[@]}"; do
  for d in $(apt-cache depends --no-recommends --no-suggests "$p" 2>/dev/null |
             awk '$1 == "Depends:" || $1 == "PreDepends:" {print $2}' | tr -d '<>'); do
    case " ${packages[*]} $assumed" in
      *" $d "*) ;;
      *) echo "fetch_debs: $p depends on $d, which is neither fetched nor assumed" >&2; exit 1;;
    esac
  done
done
cd "$root/.deb"
if ! apt-get download "${packages[@]}" >/dev/null 2>&1; then
  echo "fetch_debs: apt-get download failed; trying apt-get update first" >&2
  apt-get update -q >/dev/null
  apt-get download "${packages[@]}"
fi
# One version per package: an older download left beside a newer one would be unpacked too.
for p in "${packages[@]}"; do
  mapfile -t got < <(ls -t "${p}"_*.deb 2>/dev/null)
  [ ${#got[@]} -ge 1 ] || { echo "fetch_debs: $p was not downloaded" >&2; exit 1; }
  [ ${#got[@]} -eq 1 ] || rm -f "${got[@]:1}"
done
echo "fetch_debs: $(ls "$root/.deb"/*.deb | wc -l) packages, $(du -sh "$root/.deb" | cut -f1) in $root/.deb"

if [ "${1:-}" = --pytest ]; then
  # The GPU image ships pytest (KINDS.md); this is for an image that does not.
  mkdir -p "$root/.whl"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 -d "$root/.whl" \
    pytest==8.3.3 pluggy==1.5.0 iniconfig==2.0.0 packaging==24.1
  echo "fetch_debs: pytest wheels in $root/.whl"
fi
