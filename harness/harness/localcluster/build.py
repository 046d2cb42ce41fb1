"""Build the local control plane's binaries from the Go module proxy, cached by version.

One wrapper Go module requires the Kubernetes components, etcd, kwok and helm, so the shared
k8s.io libraries compile once; KubeRay gets a second wrapper (see BINARIES).
k8s.io/kubernetes pins its staging modules to `./staging/...`, which a module download lacks;
the wrapper replaces each with the published `v0.<minor>.<patch>` it was cut as.
"""

from __future__ import annotations

import contextlib
import fcntl
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

KUBERNETES = "v1.36.3"
ETCD = "v3.6.16"
KWOK = "v0.8.0"
KUBERAY = "v1.6.1"
HELM = "v3.21.4"
COREDNS = "v1.14.3"
# Prometheus with Kubernetes service discovery (Debian's package is built without it), for what
# scrapes the real node's pods as the chart's monitors say; v0.316.0 is Prometheus 3.16.0
PROMETHEUS = "v0.316.0"
PROMETHEUS_PACKAGE = "github.com/prometheus/prometheus/cmd/prometheus"
# kube-router's NetworkPolicy controller alone (its firewall; no routing, no service proxy): the real
# node's policy enforcer when a cluster starts with `network_policy` (node.kube_router_argv). TEST-ONLY:
# security flaws are reported against v2.1.0, the version the Go module proxy serves here; it
# programs the local cluster's firewall for the tests and is never shipped in an image or the chart.
# (sigs.k8s.io/kube-network-policies v0.8.0 is served too, but needs nftables' `queue`, which this
# kernel lacks: CONFIG_NFT_QUEUE is off.)
KUBE_ROUTER = "v2.1.0"
KUBE_ROUTER_MODULE = "github.com/cloudnativelabs/kube-router/v2"
KUBE_ROUTER_PACKAGE = KUBE_ROUTER_MODULE + "/cmd/kube-router"

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


# The real node's binaries (node.py), cached apart from the control plane's so adding them
# did not rebuild it. kubelet and kube-proxy build in the same wrapper module as the control
# plane (same k8s.io libraries, shared Go build cache); CoreDNS in one of its own (it pins an
# older client-go); `pause` is the sandbox's init: CRI needs an image and no registry is reachable.
NODE_BINARIES: dict[str, str] = {
    "kubelet": "k8s.io/kubernetes/cmd/kubelet",
    "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
    "pause": "toolrl.dev/localcluster/cmd/pause",
    "coredns": "github.com/coredns/coredns",
}

# What a pod sandbox's pause container does: hold the namespaces, reap zombies, exit on TERM/INT.
PAUSE_MAIN = """package main

import (
\t"os"
\t"os/signal"
\t"syscall"
)

func main() {
\tsigs := make(chan os.Signal, 8)
\tsignal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
\tfor s := range sigs {
\t\tif s != syscall.SIGCHLD {
\t\t\tos.Exit(0)
\t\t}
\t\tfor {
\t\t\tif pid, _ := syscall.Wait4(-1, nil, syscall.WNOHANG, nil); pid <= 0 {
\t\t\t\tbreak
\t\t\t}
\t\t}
\t}
}
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


def node_cache_key() -> str:
    spec = json.dumps(
        {
            "k8s": KUBERNETES,
            "coredns": COREDNS,
            "bins": NODE_BINARIES,
            "pause": PAUSE_MAIN,
            "go": _go_version(),
        },
        sort_keys=True,
    )
    return f"node-{KUBERNETES}-" + hashlib.sha256(spec.encode()).hexdigest()[:12]


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


def _manifest_ok(bin_dir: Path, binaries: dict[str, str] = BINARIES) -> bool:
    manifest = bin_dir / "manifest.json"
    try:
        recorded = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
    if set(recorded.get("binaries", {})) != set(binaries):
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


def _build_env() -> dict[str, str]:
    return dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod -buildvcs=false", GOTOOLCHAIN="local")


def _write_k8s_wrapper(src: Path, packages: list[str], mains: dict[str, str]) -> str:
    """The wrapper module over k8s.io/kubernetes (see the module docstring); returns its go line."""
    src.mkdir(parents=True, exist_ok=True)
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
    for cmd, text in mains.items():
        (src / "cmd" / cmd).mkdir(parents=True, exist_ok=True)
        (src / "cmd" / cmd / "main.go").write_text(text)
    _write_tools(src, packages)
    return go_line


def _write_single_wrapper(src: Path, module: str, version: str, go_line: str, package: str) -> None:
    """A wrapper module requiring one module alone (its own dependency versions, not ours)."""
    src.mkdir(parents=True, exist_ok=True)
    name = "toolrl.dev/localcluster-" + src.name.removeprefix("src-")
    (src / "go.mod").write_text(f"module {name}\n\ngo {go_line}\n\nrequire {module} {version}\n")
    _write_tools(src, [package])


def _build_all(
    jobs: dict[str, tuple[str, Path, str]], bin_dir: Path, log: Path, verbose: bool, started: float
) -> dict:
    """`go build` each name -> (package, module dir, ldflags) into bin_dir, atomically (a
    `.partial` directory renamed at the end, with a manifest of digests)."""
    env = _build_env()
    for src in sorted({d for _, d, _ in jobs.values()}):
        _run(["go", "mod", "tidy"], src, log, env)
    staging = bin_dir.with_name(bin_dir.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name, (pkg, src, ldflags) in jobs.items():
        t0 = time.monotonic()
        _run(["go", "build", "-trimpath", "-ldflags", ldflags, "-o", str(staging / name), pkg], src, log, env)
        if verbose:
            print(f"localcluster: built {name} in {time.monotonic() - t0:.0f}s", flush=True)
    manifest = {
        "binaries": {n: _sha256(staging / n) for n in jobs},
        "sizes": {n: (staging / n).stat().st_size for n in jobs},
        "buildSeconds": round(time.monotonic() - started, 1),
    }
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=1))
    staging.rename(bin_dir)
    return manifest


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Held by one process of the machine at a time (an exclusive flock on `path`, made if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _build_lock(key: str) -> contextlib.AbstractContextManager[None]:
    """One build of a cache entry at a time on the machine: a second process (a test's fixture while
    `make setup` builds) waits for the first and then finds its result, where both would otherwise
    write the same wrapper module and staging directory."""
    return file_lock(cache_root() / key / "build.lock")


def ensure_built(verbose: bool = True) -> Toolchain:
    """Return the cached toolchain, building it first if missing, partial or corrupt."""
    with _build_lock(cache_key()):
        return _ensure_built(verbose)


def _ensure_built(verbose: bool) -> Toolchain:
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

    log = root / key / "build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    started = time.monotonic()
    src, kuberay_src = root / key / "src", root / key / "src-kuberay"
    go_line = _write_k8s_wrapper(
        src,
        [p for n, p in BINARIES.items() if n != KUBERAY_BINARY and not p.startswith("toolrl.dev/")],
        {"etcd": ETCD_MAIN},
    )
    kuberay = BINARIES[KUBERAY_BINARY]  # the module is its main package
    _write_single_wrapper(kuberay_src, kuberay, KUBERAY, go_line, kuberay)
    if verbose:
        print(
            f"localcluster: building {', '.join(BINARIES)} (log: {log}); "
            "the first build takes a while, later runs reuse the cache",
            flush=True,
        )
    jobs = {
        name: (pkg, kuberay_src if name == KUBERAY_BINARY else src, _ldflags())
        for name, pkg in BINARIES.items()
    }
    manifest = _build_all(jobs, bin_dir, log, verbose, started)
    _ensure_assets(bin_dir, _build_env())
    if verbose:
        print(f"localcluster: toolchain ready in {bin_dir} ({manifest['buildSeconds']}s)", flush=True)
    return Toolchain(bin_dir, bin_dir / "crds")


def ensure_node_built(verbose: bool = True) -> Path:
    """The real node's binaries (NODE_BINARIES), cached like the control plane's; their directory."""
    with _build_lock(node_cache_key()):
        return _ensure_node_built(verbose)


def _ensure_node_built(verbose: bool) -> Path:
    root = cache_root()
    key = node_cache_key()
    bin_dir = root / key / "bin"
    if _manifest_ok(bin_dir, NODE_BINARIES):
        return bin_dir
    if bin_dir.exists():
        shutil.rmtree(bin_dir)
    log = root / key / "build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    started = time.monotonic()
    src, coredns_src = root / key / "src", root / key / "src-coredns"
    go_line = _write_k8s_wrapper(
        src, [NODE_BINARIES["kubelet"], NODE_BINARIES["kube-proxy"]], {"pause": PAUSE_MAIN}
    )
    _write_single_wrapper(coredns_src, NODE_BINARIES["coredns"], COREDNS, go_line, NODE_BINARIES["coredns"])
    if verbose:
        print(f"localcluster: building the real node's {', '.join(NODE_BINARIES)} (log: {log})", flush=True)
    jobs = {
        name: (
            pkg,
            coredns_src if name == "coredns" else src,
            "-s -w" if name in ("coredns", "pause") else _ldflags(),
        )
        for name, pkg in NODE_BINARIES.items()
    }
    manifest = _build_all(jobs, bin_dir, log, verbose, started)
    if verbose:
        print(f"localcluster: node binaries ready in {bin_dir} ({manifest['buildSeconds']}s)", flush=True)
    return bin_dir


def ensure_prometheus_built(verbose: bool = True) -> Path:
    """Prometheus built from its Go module (in a wrapper of its own: it pins its own client-go),
    cached by version; the binary's path. Without the `builtinassets` tag it serves its API and
    no web UI, which is all the tests and the demo use."""
    module = PROMETHEUS_PACKAGE.removesuffix("/cmd/prometheus")
    return _ensure_one_built(
        "prometheus",
        "Prometheus",
        PROMETHEUS,
        module,
        PROMETHEUS_PACKAGE,
        "-s -w",
        "a few minutes, once",
        verbose,
    )


def kube_router_ldflags() -> str:
    """kube-router prints the version it was stamped with (its release build's -X flags)."""
    return f"-X {KUBE_ROUTER_MODULE}/pkg/version.Version={KUBE_ROUTER} -s -w"


def ensure_kube_router_built(verbose: bool = True) -> Path:
    """kube-router built from its Go module (in a wrapper of its own: it pins its own client-go),
    cached by version apart from the node's other binaries (only clusters with `network_policy` run
    it); the binary's path. The checksum database verifies the module as for every other build."""
    return _ensure_one_built(
        "kube-router",
        "kube-router",
        KUBE_ROUTER,
        KUBE_ROUTER_MODULE,
        KUBE_ROUTER_PACKAGE,
        kube_router_ldflags(),
        "once",
        verbose,
    )


def _ensure_one_built(
    name: str, label: str, version: str, module: str, package: str, ldflags: str, when: str, verbose: bool
) -> Path:
    """One binary built from its Go module in a wrapper module of its own, cached by its version, its
    package and the Go toolchain; the binary's path."""
    root = cache_root()
    spec = json.dumps({name: version, "package": package, "go": _go_version()})
    key = f"{name}-{version}-" + hashlib.sha256(spec.encode()).hexdigest()[:12]
    with _build_lock(key):
        bin_dir = root / key / "bin"
        if _manifest_ok(bin_dir, {name: package}):
            return bin_dir / name
        shutil.rmtree(bin_dir, ignore_errors=True)
        log = root / key / "build.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        src = root / key / "src"
        _write_single_wrapper(src, module, version, _go_version().removeprefix("go"), package)
        if verbose:
            print(f"localcluster: building {label} {version} (log: {log}); {when}", flush=True)
        manifest = _build_all({name: (package, src, ldflags)}, bin_dir, log, verbose, time.monotonic())
        if verbose:
            print(f"localcluster: {label} ready in {bin_dir} ({manifest['buildSeconds']}s)", flush=True)
        return bin_dir / name


if __name__ == "__main__":
    try:
        ensure_built()
        ensure_node_built()
        ensure_kube_router_built()
    except BuildError as exc:
        sys.exit(f"localcluster build failed: {exc}")
