#!/usr/bin/env bash
# Download exactly the smoke run's locked stack (requirements.txt here) for CPython 3.12 on manylinux
# x86_64 into DIR, on any machine with PyPI access; carry DIR to the GPU machine and run
# `run.sh --wheels DIR` there (or install-wheels.sh DIR). pip checks every file against the lock's hashes.
#
#   examples/gpu-smoke/fetch-wheels.sh DIR [--with-torch]
#
# Without --with-torch, torch and what only torch needs (its CUDA runtime wheels; `wheelset.py
# torch-stack` lists them) stay out: the GPU machine has PyTorch 2.11 installed (CUDA 13 build).
# A package PyPI has no such wheel of is downloaded as its source (pip builds it offline at install).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
lock="${SMOKE_LOCK:-$here/requirements.txt}"  # another lock: tests only
[ $# -ge 1 ] || { echo "usage: $0 DIR [--with-torch]" >&2; exit 2; }
dir="$1"; shift
torch_flag=--without-torch
while [ $# -gt 0 ]; do
  case "$1" in
    --with-torch) torch_flag=""; shift ;;
    *) echo "fetch-wheels: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$dir"
"$python" "$here/wheelset.py" requirements "$lock" $torch_flag > "$dir/requirements.txt"
# the smoke machine's interpreter and platform, not this one's
target=(--python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform linux_x86_64)
if ! "$python" -m pip download --quiet --no-deps --only-binary=:all: "${target[@]}" --require-hashes \
    -r "$dir/requirements.txt" -d "$dir" 2>"$dir/download.log"; then
  # one by one, so that a package without a matching wheel comes as its source
  while read -r name; do
    one="$dir/.one.txt"
    "$python" "$here/wheelset.py" requirements "$lock" --only "$name" > "$one"
    if ! "$python" -m pip download --quiet --no-deps --only-binary=:all: "${target[@]}" --require-hashes \
        -r "$one" -d "$dir" 2>>"$dir/download.log"; then
      echo "fetch-wheels: $name has no wheel for CPython 3.12 manylinux x86_64: its source instead"
      "$python" -m pip download --quiet --no-deps --no-binary=:all: --require-hashes -r "$one" -d "$dir"
    fi
  done < <(sed -n 's/^\([A-Za-z0-9][A-Za-z0-9._-]*\)==.*/\1/p' "$dir/requirements.txt")
  rm -f "$dir/.one.txt"
fi
count="$(find "$dir" -maxdepth 1 \( -name '*.whl' -o -name '*.tar.gz' -o -name '*.zip' \) | wc -l)"
echo "fetch-wheels: $count files ($(du -sh "$dir" | cut -f1)) in $dir for $(grep -c '==' "$dir/requirements.txt") locked packages"
