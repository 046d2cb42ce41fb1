#!/usr/bin/env bash
# gpu-smoke with rollout.engine hf on one GPU, offline, from a bundle laid out as bundle/README.md says.
#   [ESTIMATOR=grpo|gae] [STEPS=2] [DEADLINE=540] bash B/device.sh   (from the repository root; $OUT
#   collects the logs)
# Ends by itself within DEADLINE seconds: the install (~1 min), then run.sh under a timeout of what is left,
# its training under a shorter one so that the verdict is still given from a cut-short log.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$SECONDS
ph() { echo "=== device.sh [$((SECONDS - T0))s] $*"; }
B="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(pwd)"
OUT="${OUT:-/tmp/devout}"; mkdir -p "$OUT"
PY="${PYTHON:-python3}"
ESTIMATOR="${ESTIMATOR:-grpo}" STEPS="${STEPS:-2}" DEADLINE="${DEADLINE:-540}" WARM_UP="${WARM_UP_SECONDS:-90}"
SITE=/tmp/smoke-site SRC=/tmp/src WORK=/tmp/smoke-work
finish() {
  ph "collecting files into \$OUT"
  for f in trainer.log tool_sandbox.log pool-metrics.txt job.json; do
    [ -f "$WORK/$f" ] && cp "$WORK/$f" "$OUT/$f"
  done
  ls -la "$OUT"
}
trap finish EXIT

ph "machine"
nvidia-smi || echo "device.sh: nvidia-smi failed"
"$PY" -c "import sys, torch; print(sys.executable, sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
echo "gcc: $(command -v gcc || echo MISSING)  headers: $("$PY" -c 'import sysconfig,os; p=sysconfig.get_paths()["include"]; print(p if os.path.exists(p+"/Python.h") else "MISSING "+p)')"
nproc; free -g | head -2

# pip --target and PYTHONPATH (as on 2026-11-27): they come before the machine's packages (transformers
# 5.9.0 over its 5.17) in this shell, run.sh and every Ray worker, which inherit the environment. A venv
# with --system-site-packages would not see the machine's torch where python3 is itself a venv's.
ph "install $(ls "$B"/wheels/*.whl | wc -l) wheels into $SITE (pip --target, no index)"
rm -rf "$SITE" && mkdir -p "$SITE"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
  --target "$SITE" "$B"/wheels/*.whl || { echo "device.sh: FAILED installing wheels"; exit 3; }
ph "unpack ray (repacked: no jars, rllib, dashboard web client)"
tar -xJf "$B"/ray-2.60.0-*.tar.xz -C "$SITE" || { echo "device.sh: FAILED unpacking ray"; exit 3; }
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import ctypes.util, sys; sys.exit(0 if ctypes.util.find_library('seccomp') else 1)"; then
  ph "no libseccomp.so.2 here: installing the carried one (Debian 12 libseccomp2 2.5.4) into /usr/local/lib"
  cp "$B/lib/libseccomp.so.2" /usr/local/lib/libseccomp.so.2 && ldconfig
fi

ph "source"
rm -rf "$SRC" && mkdir -p "$SRC"
if [ -f "$B/src.tar.xz" ]; then
  tar -xJf "$B/src.tar.xz" -C "$SRC"
else  # the working tree that came with the call, without the bundle
  tar -C "$ROOT" --exclude=./.bundle --exclude=./.git -cf - . | tar -C "$SRC" -xf -
fi
if ! "$PY" -c 'import os, sys, sysconfig; sys.exit(0 if os.path.exists(sysconfig.get_paths()["include"] + "/Python.h") else 1)'; then
  ph "no Python.h here: using the carried CPython 3.12.1 headers (same minor version, same ABI)"
  mkdir -p /tmp/pyinc && tar -xJf "$B/lib/python3.12-include.tar.xz" -C /tmp/pyinc
  export C_INCLUDE_PATH="/tmp/pyinc/python3.12${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}"
fi
ph "build trainer_entry and tool_sandbox (C extension) into $SITE"
if ! "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --disable-pip-version-check \
     --target "$SITE" "$SRC/trainer_entry" "$SRC/tool_sandbox"; then
  echo "device.sh: FAILED building trainer_entry/tool_sandbox (gcc, Python.h, setuptools?)"; exit 3
fi
"$PY" - <<'PY' || { echo "device.sh: FAILED import check"; exit 4; }
import importlib.metadata as md, ray, verl, transformers, tokenizers, torch, tensordict, celpy
import tool_sandbox.sandbox._spawner, pyseccomp, trainer_entry.hf_rollout, toolrl_api.validation
from trainer_entry import verl_internals, verl_plugin
print("imports ok:", "ray", ray.__version__, "verl", verl.__version__, "transformers", transformers.__version__,
      "from", transformers.__file__, "tokenizers", tokenizers.__version__, "numpy", md.version("numpy"),
      "torch", torch.__version__)
print("flash_attn importable:", verl_plugin.flash_attn_importable(), "- critic loader:",
      verl_internals.resolve(verl_internals.VALUEHEAD_LOADER).__module__)
PY

left=$((DEADLINE - (SECONDS - T0) - 15))
train=$((left - WARM_UP - 60))
[ "$train" -ge 120 ] || { echo "device.sh: only ${left}s left of DEADLINE=$DEADLINE: no time to train"; exit 5; }
ph "gpu-smoke run.sh --engine hf --estimator $ESTIMATOR --steps $STEPS (run.sh <= ${left}s, training <= ${train}s)"
cd "$SRC"
PYTHON="$PY" SMOKE_TRAIN_TIMEOUT="$train" \
  timeout -k 5 "$left" bash examples/gpu-smoke/run.sh --engine hf --estimator "$ESTIMATOR" --steps "$STEPS" \
  --warm-up-seconds "$WARM_UP" --work "$WORK" 2>&1 | tee "$OUT/run-sh.txt"
rc=${PIPESTATUS[0]}
ph "run.sh exit $rc (0: every acceptance check passed; 1: a check failed; 124: timed out)"
exit "$rc"
