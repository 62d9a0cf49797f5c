#!/usr/bin/env bash
# Every C, C++ and CUDA file of the project follows .clang-format, as clang-format 14 (Debian
# 12's) writes it; prints the files that do not, and how to fix them. --fix formats them.
#   tests/check_format.sh [--fix]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tests/install_deps.sh" clang-format-14 >&2
cd "$root"
mapfile -t files < <(git ls-files '*.h' '*.c' '*.cpp' '*.cu' 2>/dev/null ||
                     find src hooks cli tests examples -name '*.h' -o -name '*.c' -o -name '*.cpp' -o -name '*.cu')
if [ "${1:-}" = --fix ]; then
  clang-format-14 -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format-14 --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  printf 'format: %s does not follow .clang-format\n' "${bad[@]}" >&2
  echo "format: ${#bad[@]} file(s); tests/check_format.sh --fix formats them" >&2
  exit 1
fi
echo "format: ${#files[@]} files follow .clang-format"
