#!/usr/bin/env bash
# `make demo`: bring up the local control plane, show its nodes (GPU capacity included),
# and tear it down again if this script started it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
LOCALCLUSTER="env PYTHONPATH=tests/e2e $PY -m localcluster"

started_here=0
if ! $LOCALCLUSTER status >/dev/null 2>&1; then
  $LOCALCLUSTER up
  started_here=1
fi
cleanup() { [ "$started_here" = 1 ] && $LOCALCLUSTER down || true; }
trap cleanup EXIT

KUBECTL=".local-cluster/bin/kubectl --kubeconfig .local-cluster/kubeconfig"
echo; echo "== nodes"
$KUBECTL get nodes -o custom-columns='NAME:.metadata.name,STATUS:.status.conditions[?(@.type=="Ready")].type,GPU:.status.allocatable.nvidia\.com/gpu,CPU:.status.allocatable.cpu,MEMORY:.status.allocatable.memory'
echo; echo "== server version"
$KUBECTL version
