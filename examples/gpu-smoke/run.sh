#!/usr/bin/env bash
# Acceptance run of the GPU path on one GPU, offline: GRPO (or GAE) steps of a tiny model made here,
# rollouts by verl's vLLM server with tool calls into a real tool pool, then acceptance.py's verdict (exit
# code, steps, tool calls counted by the pool, rollout-vs-actor log-prob agreement, weights synced, and
# with gae the critic's updates).
# README.md (this directory) says what the machine needs and how to carry the wheels in.
#
#   examples/gpu-smoke/run.sh [--wheels DIR] [--work DIR] [--steps N] [--protocol P] [--port N]
#                             [--engine vllm|hf] [--estimator grpo|gae] [--warm-up-seconds S] [--cpu]
#                             [--dry-run]
#
#   --wheels DIR   install the locked stack from DIR first (fetch-wheels.sh), with pip --no-index
#   --work DIR     where the data, model, logs go (default: a new temporary directory)
#   --steps N      training steps (default 3)
#   --protocol P   hermes (default), python-tags, tool-tags or react
#   --port N       the tool pool's port (default 18080; its /metrics on the next one)
#   --engine E     the rollout engine: vllm (default; the path users pay for) or hf (transformers, no
#                  vLLM needed: the FSDP actor still trains on the GPU)
#   --estimator A  the job's spec.algorithm.advantageEstimator: grpo (default) or gae (PPO with a critic,
#                  the value model verl loads from the same model; the verdict then checks it trained)
#   --warm-up-seconds S  the tiny model's warm-up on the job's prompts (default 300)
#   --cpu          the same flow on CPUs (engine hf, gpusPerWorker 0): checks this script where no GPU is
#   --dry-run      check the arguments and the machine, print the job, stop
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-python3}"
wheels="" work="" steps=3 protocol=hermes port=18080 cpu=0 dry=0 engine="" warm_up=300 estimator=grpo
usage() { sed -n '7,23p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "gpu-smoke: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) [ $# -ge 2 ] || usage; wheels="$2"; shift 2 ;;
    --work) [ $# -ge 2 ] || usage; work="$2"; shift 2 ;;
    --steps) [ $# -ge 2 ] || usage; steps="$2"; shift 2 ;;
    --protocol) [ $# -ge 2 ] || usage; protocol="$2"; shift 2 ;;
    --port) [ $# -ge 2 ] || usage; port="$2"; shift 2 ;;
    --engine) [ $# -ge 2 ] || usage; engine="$2"; shift 2 ;;
    --estimator) [ $# -ge 2 ] || usage; estimator="$2"; shift 2 ;;
    --warm-up-seconds) [ $# -ge 2 ] || usage; warm_up="$2"; shift 2 ;;
    --cpu) cpu=1; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage ;;
    *) echo "gpu-smoke: unknown argument '$1'" >&2; usage ;;
  esac
done
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || die "--steps must be a positive integer, got '$steps'"
[[ "$port" =~ ^[1-9][0-9]*$ ]] && [ "$port" -lt 65535 ] || die "--port must be a TCP port below 65535 (its /metrics take the next), got '$port'"
case "$protocol" in hermes|python-tags|tool-tags|react) ;; *) die "--protocol must be hermes, python-tags, tool-tags or react, got '$protocol'" ;; esac
case "$engine" in ""|vllm|hf) ;; *) die "--engine must be vllm or hf, got '$engine'" ;; esac
case "$estimator" in grpo|gae) ;; *) die "--estimator must be grpo or gae, got '$estimator'" ;; esac
[[ "$warm_up" =~ ^[1-9][0-9]*$ ]] || die "--warm-up-seconds must be a positive integer, got '$warm_up'"
if [ "$cpu" = 1 ] && [ "$engine" = vllm ]; then
  die "--cpu runs engine hf (vLLM's CPU build is make test's path, not this script's): drop --engine vllm or --cpu"
fi
if [ -n "$wheels" ] && [ ! -d "$wheels" ]; then die "--wheels $wheels is not a directory (make it with fetch-wheels.sh)"; fi
work="${work:-$(mktemp -d -t gpu-smoke-XXXX)}"
mkdir -p "$work"
work="$(cd "$work" && pwd)"
start=$SECONDS
phase() { echo "gpu-smoke: [$((SECONDS - start))s] $*"; }

if [ -n "$wheels" ]; then
  phase "installing the locked stack from $wheels (no index)"
  PYTHON="$python" "$here/install-wheels.sh" "$wheels"
fi

if [ "$cpu" = 1 ]; then engine=hf gpus=0; else engine="${engine:-vllm}" gpus=1; fi
if [ "$cpu" = 0 ]; then
  driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 || true)"
  [ -n "$driver" ] || die "nvidia-smi found no GPU (or use --cpu)"
  [ "${driver%%.*}" -ge 580 ] || die "NVIDIA driver $driver: the stack is CUDA 13, which needs driver >= 580"
  "$python" - "$engine" <<'PY' || die "the GPU stack does not import (install it with --wheels DIR)"
import importlib, sys
import torch, verl
assert torch.cuda.is_available(), "torch sees no CUDA device"
# engine hf samples with transformers: vLLM is not needed
engine = importlib.import_module(sys.argv[1] if sys.argv[1] == "vllm" else "transformers")
print(f"gpu-smoke: torch {torch.__version__} on {torch.cuda.get_device_name(0)}, verl {verl.__version__}, "
      f"{engine.__name__} {engine.__version__}")
PY
fi

# the job: the template with this run's paths and choices
"$python" - "$here/job.json" "$work" "$steps" "$protocol" "$engine" "$gpus" "$estimator" > "$work/job.json" <<'PY'
import json, sys
template, work, steps, protocol, engine, gpus, estimator = sys.argv[1:]
job = json.load(open(template))
spec = job["spec"]
spec["model"]["path"] = f"{work}/model"
spec["data"]["trainFiles"] = [f"{work}/data/train.parquet"]  # Ray actors run in their own directory
spec["algorithm"]["totalTrainingSteps"] = int(steps)
# gae: verl adds a critic (a value model loaded from spec.model.path: translate.py's critic.model.path)
spec["algorithm"]["advantageEstimator"] = estimator
spec["rollout"].update(protocol=protocol, engine=engine)
spec["cluster"]["workers"]["gpusPerWorker"] = int(gpus)
if engine == "vllm":  # vLLM's engine statistics in the log: acceptance.py's proof that vLLM served
    spec["trainer"]["extraArgs"].append("actor_rollout_ref.rollout.disable_log_stats=false")
json.dump(job, sys.stdout, indent=1)
PY
if [ "$dry" = 1 ]; then cat "$work/job.json"; exit 0; fi

phase "data: GSM8K-style sample prompted for $protocol"
"$python" -m trainer_entry.data gsm8k "$repo/examples/gsm8k/sample.jsonl" --output-dir "$work/data" --protocol "$protocol"
phase "tiny model: warmed up on the job's prompts, protocol and tool"
"$python" -m trainer_entry tiny-model "$work/model" --spec "$work/job.json" --warm-up-seconds "$warm_up"

metrics_port=$((port + 1))
phase "tool pool on 127.0.0.1:$port (/metrics on $metrics_port)"
printf 'tools:\n  - {name: python, type: python, timeoutSeconds: 5, memoryLimitMiB: 1024}\n' > "$work/tools.yaml"
landlock="$("$python" -c 'from tool_sandbox.sandbox.landlock import abi_version; print(abi_version())')"
pool_args=()
if [ "$landlock" = 0 ]; then
  echo "gpu-smoke: this kernel has no Landlock: the pool serves with --allow-no-landlock (seccomp, uids)"
  pool_args+=(--allow-no-landlock)
fi
"$python" -m tool_sandbox serve --host 127.0.0.1 --port "$port" --metrics-port "$metrics_port" --config "$work/tools.yaml" \
  --workdir "$work/pool" "${pool_args[@]}" > "$work/tool_sandbox.log" 2>&1 &
pool=$!
trap 'kill "$pool" 2>/dev/null; wait "$pool" 2>/dev/null || true' EXIT
"$python" - "$port" "$pool" <<'PY' || { tail -20 "$work/tool_sandbox.log" >&2; die "the tool pool did not become ready"; }
import os, sys, time, urllib.request
port, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit("the pool exited")
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).status == 200:
            sys.exit(0)
    except OSError:
        pass
    time.sleep(1)
sys.exit("not ready after 120 s")
PY

phase "training: $steps steps of $estimator, engine $engine (log: $work/trainer.log)"
set +e
TOOLRL_TOOL_POOL_URL="http://127.0.0.1:$port" TOOLRL_POOL_WAIT_SECONDS=60 VLLM_LOG_STATS_INTERVAL=2 \
  timeout "${SMOKE_TRAIN_TIMEOUT:-1500}" "$python" -m trainer_entry run --spec "$work/job.json" \
  --workdir "$work/workdir" > "$work/trainer.log" 2>&1
rc=$?
set -e
"$python" -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$metrics_port/metrics', timeout=10).read().decode())" \
  > "$work/pool-metrics.txt"
phase "verdict"
"$python" "$here/acceptance.py" --log "$work/trainer.log" --pool-metrics "$work/pool-metrics.txt" \
  --exit-code "$rc" --steps "$steps" --engine "$engine" --estimator "$estimator" && verdict=0 || verdict=$?
[ "$rc" = 0 ] || tail -40 "$work/trainer.log" >&2
phase "done; files in $work"
exit "$verdict"
