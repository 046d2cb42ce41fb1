#!/usr/bin/env bash
# Two real GRPO steps of Qwen2.5-0.5B-Instruct with python-tags tool calls, on one GPU.
# Run from the repository root on a machine with one CUDA GPU (>= 16 GB) and internet access to the
# model hub, after `pip install -r images/trainer/requirements.txt -e trainer_entry -e tool_sandbox`
# (or inside the toolrl-trainer image):   bash examples/gpu-smoke/run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="${WORK_DIR:-$(mktemp -d -t gpu-smoke-XXXX)}"
port="${TOOL_PORT:-18080}"
cd "$work"

python -m trainer_entry.data gsm8k "$here/gsm8k-sample.jsonl" --output-dir data
printf 'tools:\n  - {name: python, type: python, timeoutSeconds: 5, memoryLimitMiB: 1024}\n' > tools.yaml
python -m tool_sandbox serve --host 127.0.0.1 --port "$port" --config tools.yaml > tool_sandbox.log 2>&1 &
pool=$!
trap 'kill $pool' EXIT

# Without RAY_ADDRESS the trainer starts a local Ray for the run (with the machine's GPU).
# Ray actors run in their own working_dir: give them the data by absolute path.
sed "s#\"data/train.parquet\"#\"$work/data/train.parquet\"#" "$here/job.json" > job.json
python -m trainer_entry run --spec job.json --dry-run > dry-run.txt
TOOLRL_TOOL_POOL_URL="http://127.0.0.1:$port" TOOLRL_POOL_WAIT_SECONDS=60 \
  python -m trainer_entry run --spec job.json --workdir "$work/workdir"
echo "two steps done; logs in $work"
