"""Build the local control plane's binaries from the Go module proxy, cached by version.

One wrapper Go module requires the Kubernetes components, etcd, kwok and helm, so the shared
k8s.io libraries compile once; KubeRay gets a second wrapper (see BINARIES).
k8s.io/kubernetes pins its staging modules to `./staging/...`, which a module download lacks;
the wrapper replaces each with the published `v0.<minor>.<patch>` it was cut as.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

KUBERNETES = "v1.36.3"
ETCD = "v3.6.16"
KWOK = "v0.8.0"
KUBERAY = "v1.6.1"
HELM = "v3.21.4"

# binary name -> Go package to build. KubeRay builds in a wrapper module of its own: it pins
# an older controller-runtime than kwok needs, and Go's MVS would otherwise lift it.
KUBERAY_BINARY = "kuberay-operator"
BINARIES: dict[str, str] = {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
    "etcd": "toolrl.dev/localcluster/cmd/etcd",
    "kwok": "sigs.k8s.io/kwok/cmd/kwok",
    "kuberay-operator": "github.com/ray-project/kuberay/ray-operator",
    "helm": "helm.sh/helm/v3/cmd/helm",
}

ETCD_MAIN = """package main

import (
\t"os"

\t"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
"""


class BuildError(RuntimeError):
    """A build step failed; the message says which and what to do."""


@dataclass(frozen=True)
class Toolchain:
    bin_dir: Path
    kuberay_crds: Path

    def path(self, name: str) -> str:
        return str(self.bin_dir / name)


def cache_root() -> Path:
    return Path(os.environ.get("TOOLRL_CACHE", Path.home() / ".cache" / "toolrl-localcluster"))


def cache_key() -> str:
    spec = json.dumps(
        {
            "k8s": KUBERNETES,
            "etcd": ETCD,
            "kwok": KWOK,
            "kuberay": KUBERAY,
            "helm": HELM,
            "bins": BINARIES,
            "go": _go_version(),
        },
        sort_keys=True,
    )
    return f"k8s-{KUBERNETES}-" + hashlib.sha256(spec.encode()).hexdigest()[:12]


def _go_version() -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            "Go is not installed or not on PATH: the local control plane is built from Go modules. "
            "Install Go >= 1.26 (https://go.dev/doc/install) and run again."
        )
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _proxy() -> str:
    return (
        os.environ.get("GOPROXY")
        or subprocess.run(["go", "env", "GOPROXY"], capture_output=True, text=True, check=True).stdout.strip()
    )


def _fetch_mod(module: str, version: str) -> str:
    """Read a module's go.mod from the first HTTP proxy in GOPROXY."""
    proxies = [p for p in re.split(r"[,|]", _proxy()) if p.startswith("http")]
    if not proxies:
        raise BuildError(f"GOPROXY={_proxy()!r} names no HTTP module proxy; set GOPROXY to one.")
    url = f"{proxies[0].rstrip('/')}/{module}/@v/{version}.mod"
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            return resp.read().decode()
    except (urllib.error.URLError, TimeoutError) as exc:
        raise BuildError(
            f"cannot reach the Go module proxy for {module}@{version} ({url}): {exc}. "
            "The local control plane is built from the module proxy; check GOPROXY and the network."
        ) from exc


def staging_replaces(k8s_mod: str, version: str = KUBERNETES) -> dict[str, str]:
    """Map each staging module of k8s.io/kubernetes to its published v0.x.y."""
    staging_version = "v0." + version.removeprefix("v1.")
    names = re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", k8s_mod, re.M)
    return {name: staging_version for name in names}


def _published(module: str, version: str) -> bool:
    try:
        _fetch_mod(module, version)
    except BuildError:
        return False
    return True


def wrapper_gomod(replaces: dict[str, str], go_line: str, stubs: frozenset[str] = frozenset()) -> str:
    """The wrapper's go.mod; `stubs` are staging modules the proxy lacks, pointed at empty local
    modules (nothing built imports them, but the module graph names them)."""
    lines = ["module toolrl.dev/localcluster", "", f"go {go_line}", "", "require ("]
    lines += [
        f"\tk8s.io/kubernetes {KUBERNETES}",
        f"\tgo.etcd.io/etcd/server/v3 {ETCD}",
        f"\tsigs.k8s.io/kwok {KWOK}",
        f"\thelm.sh/helm/v3 {HELM}",
    ]
    lines += [f"\t{name} {ver}" for name, ver in sorted(replaces.items()) if name not in stubs]
    lines += [")", "", "replace ("]
    lines += [
        f"\t{name} => ./stubs/{name}" if name in stubs else f"\t{name} => {name} {ver}"
        for name, ver in sorted(replaces.items())
    ]
    lines += [")", ""]
    return "\n".join(lines)


def _ldflags() -> str:
    major, minor = KUBERNETES.removeprefix("v").split(".")[:2]
    values = {
        "gitVersion": KUBERNETES,
        "gitMajor": major,
        "gitMinor": minor,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
    }
    pkgs = ["k8s.io/component-base/version", "k8s.io/client-go/pkg/version"]
    return " ".join(f"-X {pkg}.{k}={v}" for pkg in pkgs for k, v in values.items()) + " -s -w"


def _run(cmd: list[str], cwd: Path, log: Path, env: dict[str, str]) -> None:
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        rc = subprocess.run(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise BuildError(f"`{' '.join(cmd)}` failed (exit {rc}); last lines of {log}:\n{tail}")


def _manifest_ok(bin_dir: Path) -> bool:
    manifest = bin_dir / "manifest.json"
    try:
        recorded = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
    if set(recorded.get("binaries", {})) != set(BINARIES):
        return False
    for name, digest in recorded["binaries"].items():
        f = bin_dir / name
        if not f.is_file() or f.stat().st_size != recorded["sizes"][name]:
            return False
        if _sha256(f) != digest:
            return False
    return True


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# Plain-file assets that come with the modules: KubeRay's CRDs and kwok's "fast" stages (nodes
# Ready with lease heartbeats, pods Running at once), which kwok >= 0.7 no longer embeds.
KWOK_STAGES = [
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
]


def _module_dir(module: str, version: str, env: dict[str, str]) -> Path:
    res = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=cache_root(),
    )
    info = json.loads(res.stdout or "{}")
    if res.returncode or "Dir" not in info:
        raise BuildError(
            f"cannot download {module}@{version} from the Go module proxy: "
            f"{info.get('Error') or res.stderr.strip()}"
        )
    return Path(info["Dir"])


def _ensure_assets(bin_dir: Path, env: dict[str, str]) -> None:
    crds, stages = bin_dir / "crds", bin_dir / "kwok-stages.yaml"
    if not (crds.is_dir() and any(crds.glob("ray.io_*.yaml"))):
        tmp = bin_dir / "crds.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        kuberay = _module_dir("github.com/ray-project/kuberay/ray-operator", KUBERAY, env)
        shutil.copytree(kuberay / "config" / "crd" / "bases", tmp)
        for f in tmp.iterdir():
            f.chmod(0o644)
        shutil.rmtree(crds, ignore_errors=True)
        tmp.rename(crds)
    if not stages.is_file():
        kwok = _module_dir("sigs.k8s.io/kwok", KWOK, env) / "kustomize" / "stage"
        text = "\n---\n".join((kwok / rel).read_text().strip() for rel in KWOK_STAGES)
        stages.with_suffix(".partial").write_text(text + "\n")
        stages.with_suffix(".partial").rename(stages)


def _write_tools(src: Path, packages: list[str]) -> None:
    """A build-tagged file importing each main package, so `go mod tidy` records their modules."""
    imports = "".join(f'\t_ "{pkg}"\n' for pkg in packages)
    (src / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{imports})\n")


def ensure_built(verbose: bool = True) -> Toolchain:
    """Return the cached toolchain, building it first if missing, partial or corrupt."""
    root = cache_root()
    key = cache_key()
    bin_dir = root / key / "bin"
    if _manifest_ok(bin_dir):
        _ensure_assets(bin_dir, dict(os.environ, GOFLAGS="-mod=mod"))
        return Toolchain(bin_dir, bin_dir / "crds")
    if bin_dir.exists():
        if verbose:
            print(f"localcluster: cache at {bin_dir} is partial or corrupt; rebuilding", flush=True)
        shutil.rmtree(bin_dir)

    src = root / key / "src"
    src.mkdir(parents=True, exist_ok=True)
    log = root / key / "build.log"
    log.write_text("")
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod -buildvcs=false", GOTOOLCHAIN="local")
    started = time.monotonic()

    k8s_mod = _fetch_mod("k8s.io/kubernetes", KUBERNETES)
    go_line = re.search(r"^go (\S+)", k8s_mod, re.M).group(1)  # type: ignore[union-attr]
    replaces = staging_replaces(k8s_mod)
    stubs = frozenset(
        m for m, v in replaces.items() if m.startswith("k8s.io/sample") and not _published(m, v)
    )
    for name in stubs:
        (src / "stubs" / name).mkdir(parents=True, exist_ok=True)
        (src / "stubs" / name / "go.mod").write_text(f"module {name}\n\ngo {go_line}\n")
    (src / "go.mod").write_text(wrapper_gomod(replaces, go_line, stubs))
    (src / "cmd" / "etcd").mkdir(parents=True, exist_ok=True)
    (src / "cmd" / "etcd" / "main.go").write_text(ETCD_MAIN)
    _write_tools(
        src, [p for n, p in BINARIES.items() if n != KUBERAY_BINARY and not p.startswith("toolrl.dev/")]
    )
    kuberay_src = root / key / "src-kuberay"
    kuberay_src.mkdir(parents=True, exist_ok=True)
    (kuberay_src / "go.mod").write_text(
        f"module toolrl.dev/localcluster-kuberay\n\ngo {go_line}\n\n"
        f"require github.com/ray-project/kuberay/ray-operator {KUBERAY}\n"
    )
    _write_tools(kuberay_src, [BINARIES[KUBERAY_BINARY]])
    if verbose:
        print(
            f"localcluster: building {', '.join(BINARIES)} (log: {log}); "
            "the first build takes a while, later runs reuse the cache",
            flush=True,
        )
    _run(["go", "mod", "tidy"], src, log, env)
    _run(["go", "mod", "tidy"], kuberay_src, log, env)

    staging = bin_dir.with_name("bin.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name, pkg in BINARIES.items():
        t0 = time.monotonic()
        _run(
            ["go", "build", "-trimpath", "-ldflags", _ldflags(), "-o", str(staging / name), pkg],
            kuberay_src if name == KUBERAY_BINARY else src,
            log,
            env,
        )
        if verbose:
            print(f"localcluster: built {name} in {time.monotonic() - t0:.0f}s", flush=True)

    manifest = {
        "binaries": {n: _sha256(staging / n) for n in BINARIES},
        "sizes": {n: (staging / n).stat().st_size for n in BINARIES},
        "buildSeconds": round(time.monotonic() - started, 1),
    }
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=1))
    staging.rename(bin_dir)
    _ensure_assets(bin_dir, env)
    if verbose:
        print(f"localcluster: toolchain ready in {bin_dir} ({manifest['buildSeconds']}s)", flush=True)
    return Toolchain(bin_dir, bin_dir / "crds")


if __name__ == "__main__":
    try:
        ensure_built()
    except BuildError as exc:
        sys.exit(f"localcluster build failed: {exc}")
