#!/usr/bin/env bash
# Install what fetch-wheels.sh put in DIR, with no index (offline), then trainer_entry and tool_sandbox
# from this checkout. Every file is checked against the lock's hashes; nothing is resolved.
#
#   examples/gpu-smoke/install-wheels.sh DIR        (PYTHON=... for another interpreter)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-python3}"
lock="${SMOKE_LOCK:-$here/requirements.txt}"  # another lock: tests only
[ $# -eq 1 ] && [ -f "$1/requirements.txt" ] || { echo "usage: $0 DIR (made by fetch-wheels.sh)" >&2; exit 2; }
dir="$1"
offline=(--no-index --find-links "$dir" --no-deps --disable-pip-version-check)
# build backends first: packages that come as source, and our two, build without isolation
"$python" "$here/wheelset.py" requirements "$lock" --only setuptools hatchling \
  packaging pathspec pluggy trove-classifiers > "$dir/.build.txt"
"$python" -m pip install "${offline[@]}" --require-hashes -r "$dir/.build.txt"
"$python" -m pip install "${offline[@]}" --require-hashes --no-build-isolation -r "$dir/requirements.txt"
# tool_sandbox compiles its C extension here (gcc and the Python headers)
"$python" -m pip install "${offline[@]}" --no-build-isolation "$repo/trainer_entry" "$repo/tool_sandbox"
"$python" -m pip check || echo "install-wheels: pip check reports the above (the preinstalled PyTorch's own pins?)" >&2
