#!/usr/bin/env bash
# `make gpu-image-check`: build the trainer's GPU variant (images.py's `trainer-gpu`: VARIANT=gpu on the
# Debian base, CUDA from PyPI's wheels) and run it in a pod on a local cluster's real (CPU) node: vLLM,
# verl and torch import, FlashInfer's JIT compiles one of its kernels for an H100 (sm_90a) with the image's
# nvcc, and `trainer_entry run --dry-run` of examples/toolrljob.yaml passes.
# No GPU is needed: nothing here touches CUDA. Not part of `make test` (a cold build downloads ~4 GB of
# wheels and needs ~40 GB free; images/README.md has the measured size and time).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
LC=("$PY" -m harness.localcluster)
ROOT="$(mktemp -d -t toolrl-gpu-image-check.XXXXXX)"
POD=gpu-image-check

"${LC[@]}" --root "$ROOT" images trainer-gpu  # build only: no cluster runs at $ROOT yet
REF="$("$PY" -c 'from harness.localcluster.images import image_ref; print(image_ref("trainer-gpu"))')"

cleanup() { "${LC[@]}" --root "$ROOT" down || true; rm -rf "$ROOT"; }
trap cleanup EXIT
# up without the operator's and tool sandbox's images (`localcluster up` imports them): the pod needs none
"$PY" -c 'import sys; from pathlib import Path; from harness.localcluster.cluster import LocalCluster
LocalCluster(Path(sys.argv[1]), real_node=True).up()' "$ROOT"
"${LC[@]}" --root "$ROOT" images trainer-gpu  # the archive is built: imports it into the real node
KUBECTL="$("$PY" -c 'from harness.localcluster.build import ensure_built; print(ensure_built(False).path("kubectl"))')"
k() { "$KUBECTL" --kubeconfig "$ROOT/kubeconfig" "$@"; }

# the job as the operator hands it to the trainer: the whole ToolRLJob as JSON at TOOLRL_JOB_SPEC
"$PY" -c 'import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))' \
  examples/toolrljob.yaml > "$ROOT/job.json"
k create configmap "$POD-job" --from-file=job.json="$ROOT/job.json"
k apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $POD}
spec:
  restartPolicy: Never
  containers:
    - name: check
      image: $REF
      imagePullPolicy: Never
      command: [bash, -c]
      args:
        - >-
          python -c "import vllm, verl, torch; print('versions', vllm.__version__, verl.__version__, torch.__version__)"
          && nvcc --version | tail -1
          && FLASHINFER_CUDA_ARCH_LIST=9.0a python -c "from flashinfer.jit.norm import gen_norm_module;
          spec = gen_norm_module(); spec.build(verbose=False); print('flashinfer jit built', spec.jit_library_path)"
          && python -m trainer_entry run --dry-run --workdir /tmp/dry-run
      volumeMounts:
        - {name: job, mountPath: /etc/toolrl}
        - {name: tmp, mountPath: /tmp}
  volumes:
    - name: job
      configMap: {name: $POD-job}
    - name: tmp
      emptyDir: {}
EOF
phase=""
for _ in $(seq 180); do  # up to 15 minutes: an image of ~10 GB starts slowly on a loaded node
  phase="$(k get pod "$POD" -o jsonpath='{.status.phase}')"
  [[ "$phase" == Succeeded || "$phase" == Failed ]] && break
  sleep 5
done
k logs "$POD" || true
if [[ "$phase" != Succeeded ]]; then
  echo "gpu-image-check: the pod ended $phase (not Succeeded); its events:" >&2
  k describe pod "$POD" | tail -20 >&2
  exit 1
fi
echo "gpu-image-check: vLLM, verl and torch import, FlashInfer's JIT builds for sm_90a and the GPU example's dry run passes in $REF"
