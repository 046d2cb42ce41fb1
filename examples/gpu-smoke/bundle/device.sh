#!/usr/bin/env bash
# gpu-smoke with rollout.engine hf on one GPU, offline, from a bundle laid out as bundle/README.md says.
#   bash B/device.sh        (from the repository root; $OUT collects the logs)
# Ends within ~540 s: install <= 90 s, tiny model warm-up capped, training capped by SMOKE_TRAIN_TIMEOUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$SECONDS
ph() { echo "=== device.sh [$((SECONDS - T0))s] $*"; }
B="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-/tmp/devout}"; mkdir -p "$OUT"
PY="${PYTHON:-python3}"
VENV=/tmp/smoke-venv SRC=/tmp/src WORK="$OUT/work"
finish() {
  ph "collecting files into \$OUT"
  for f in trainer.log tool_sandbox.log pool-metrics.txt job.json; do
    [ -f "$WORK/$f" ] && cp "$WORK/$f" "$OUT/$f"
  done
  rm -rf "$WORK"   # the model/data/workdir would not come back anyway (too deep, too many files)
  ls -la "$OUT"
}
trap finish EXIT

ph "machine"
nvidia-smi || echo "device.sh: nvidia-smi failed"
"$PY" -c "import sys, torch; print(sys.executable, sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
echo "gcc: $(command -v gcc || echo MISSING)  headers: $("$PY" -c 'import sysconfig,os; p=sysconfig.get_paths()["include"]; print(p if os.path.exists(p+"/Python.h") else "MISSING "+p)')"
nproc; free -g | head -2

ph "install wheels into a venv over the machine's packages ($VENV)"
rm -rf "$VENV" && "$PY" -m venv --system-site-packages "$VENV" || { echo "device.sh: FAILED making $VENV"; exit 3; }
PY="$VENV/bin/python"  # its own packages come before the machine's (transformers 5.9 over 5.17)
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
  "$B"/wheels/*.whl || { echo "device.sh: FAILED installing wheels"; exit 3; }
ph "unpack ray (repacked: no jars, rllib, dashboard web client)"
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
tar -xJf "$B"/ray-2.60.0-*.tar.xz -C "$SITE" || { echo "device.sh: FAILED unpacking ray"; exit 3; }
export PATH="$VENV/bin:$PATH"
if ! "$PY" -c "import ctypes.util, sys; sys.exit(0 if ctypes.util.find_library('seccomp') else 1)"; then
  ph "no libseccomp.so.2 here: installing the carried one (Debian 12 libseccomp2 2.5.4) into /usr/local/lib"
  cp "$B/lib/libseccomp.so.2" /usr/local/lib/libseccomp.so.2 && ldconfig
fi

ph "source"
rm -rf "$SRC" && mkdir -p "$SRC"
if [ -f "$B/src.tar.xz" ]; then tar -xJf "$B/src.tar.xz" -C "$SRC"; else cp -a . "$SRC"; fi
if ! "$PY" -c 'import os, sys, sysconfig; sys.exit(0 if os.path.exists(sysconfig.get_paths()["include"] + "/Python.h") else 1)'; then
  ph "no Python.h here: using the carried CPython 3.12.1 headers (same minor version, same ABI)"
  mkdir -p /tmp/pyinc && tar -xJf "$B/lib/python3.12-include.tar.xz" -C /tmp/pyinc
  export C_INCLUDE_PATH="/tmp/pyinc/python3.12${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}"
fi
ph "build trainer_entry and tool_sandbox (C extension) into $VENV"
if ! "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --disable-pip-version-check \
     "$SRC/trainer_entry" "$SRC/tool_sandbox"; then
  echo "device.sh: FAILED building trainer_entry/tool_sandbox (gcc, Python.h, setuptools?)"; exit 3
fi
"$PY" - <<'PY' || { echo "device.sh: FAILED import check"; exit 4; }
import importlib.metadata as md, ray, verl, transformers, tokenizers, torch, tensordict
import tool_sandbox.sandbox._spawner, pyseccomp, trainer_entry.hf_rollout
print("imports ok:", "ray", ray.__version__, "verl", verl.__version__, "transformers", transformers.__version__,
      "tokenizers", tokenizers.__version__, "numpy", md.version("numpy"), "torch", torch.__version__)
PY

ph "gpu-smoke run.sh --engine hf --steps 2"
cd "$SRC"
PYTHON="$PY" SMOKE_TRAIN_TIMEOUT="${SMOKE_TRAIN_TIMEOUT:-330}" \
  timeout -k 10 "${SMOKE_TIMEOUT:-470}" bash examples/gpu-smoke/run.sh --engine hf --steps 2 \
  --warm-up-seconds "${WARM_UP_SECONDS:-90}" --work "$WORK" 2>&1 | tee "$OUT/run-sh.txt"
rc=${PIPESTATUS[0]}
ph "run.sh exit $rc (0: every acceptance check passed; 1: a check failed; 124: timed out)"
exit "$rc"
