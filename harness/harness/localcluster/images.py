"""Build the project's images (images/<name>/Dockerfile) with buildah on a Debian base made
here with mmdebstrap (no container registry is reachable), keyed by their inputs.

- The base is `mmdebstrap --variant=minbase` of bookworm with Python 3.11, packed as an OCI
  archive; the Dockerfiles take it through their `BASE_IMAGE` build argument (elsewhere they
  build on the registry's python:3.11-slim-bookworm unchanged).
- Each image's key hashes its Dockerfile, every file its COPY lines bring in, the base's key and
  the build arguments: an image whose key has an archive in the cache is never rebuilt.
- The host's CA bundle is mounted read-only for the build only (pip behind this workplace's TLS
  proxy needs it), never copied into a layer. The host's uv cache is mounted where the trainer's
  Dockerfile points uv, so a rebuild downloads no torch again.
- The result is an OCI archive named as the chart and the operator name the images by default
  (`toolrl-<name>:<appVersion>`), which `RealNode.import_image` loads into the node's containerd:
  kubelet then finds it and pulls nothing.
- buildah's storage stays bounded: after a build, each non-final stage is tagged beside the image
  (its layers are the cache the next rebuild needs, e.g. the trainer's venv), older tags and
  archives of the same image go, and then every untagged image no tagged one builds on. Before a
  build, the working containers of killed builds go. One build at a time (a file lock).
- A build stops (the process is killed) when the disk's free space falls under min_free(): at a full
  disk the real node's kubelet evicts pods and collects images.
- Variants (VARIANTS, e.g. `trainer-gpu`: the trainer's Dockerfile with VARIANT=gpu) build only when
  named, never with `make images`.

`python -m harness.localcluster images [NAME...]` builds them (make images).
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from harness import REPO

from .build import cache_root
from .node import EVICTION_FREE_PERCENT
from .oci import write_oci_archive

IMAGES_DIR = REPO / "images"
SUITE = "bookworm"
# the stand-in for python:3.11-slim-bookworm: an interpreter with venv, pip and the C headers
# (tool_sandbox's extension: `Python.h: No such file` without them), and a CA store
BASE_PACKAGES = [
    "python3",
    "python3-pip",
    "python3-venv",
    "python-is-python3",
    "libpython3.11-dev",
    "ca-certificates",
]
BASE_HOOKS = [
    # pip installs system-wide in an image, as in python:3.11-slim (PEP 668 marker removed)
    'rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED',
    # apt in later layers keeps no package files (what the official images configure)
    "printf 'DPkg::Post-Invoke { \"rm -f /var/cache/apt/archives/*.deb || true\"; };\\n'"
    ' > "$1"/etc/apt/apt.conf.d/docker-clean',
]
BASE_REF = "localhost/toolrl/debian-python"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
HOST_UV_CACHE = Path(os.environ.get("UV_CACHE_DIR", Path.home() / ".cache" / "uv"))
# Debian packages the builds need (named in the error when one is missing)
TOOLS = {"buildah": "buildah", "mmdebstrap": "mmdebstrap"}
ALL_IMAGES = sorted(p.parent.name for p in IMAGES_DIR.glob("*/Dockerfile"))
# Images built from another image's Dockerfile with other build arguments, only when named
# (`python -m harness.localcluster images trainer-gpu`, `make gpu-image-check`): not in ALL_IMAGES.
VARIANTS = {"trainer-gpu": "trainer"}
# Build arguments beyond BASE_IMAGE ({base}: the base's archive). The trainer's CPU variant (the
# hf engine) builds on the same Debian base and installs through uv with the host's cache; so does
# the GPU variant, whose lock shares torch and 15 nvidia-* packages with the CPU one (it downloads 29
# wheels beyond them, ~1.2 GB: vLLM, flashinfer, the CUDA compiler, ...).
EXTRA_BUILD_ARGS = {
    "trainer": {"VARIANT": "cpu", "UV_NO_CACHE": "0"},
    "trainer-gpu": {"VARIANT": "gpu", "UV_NO_CACHE": "0"},
}
GiB = 1 << 30
# What a build leaves free beyond the point where the real node's kubelet starts evicting pods and
# collecting images (the pause image among them), failing whatever the cluster runs (min_free).
BUILD_MARGIN = 1 * GiB
# What a build needs free beyond min_free() before it starts, where it is large. The GPU trainer's venv
# (9.5 GB: its lock installed on this host; the CPU one's is 6 GB) is written once (one stage), in three
# layers: buildah holds a layer it commits about four times over (the container's files, two temporary
# copies, the layer: a 9.5 GB venv layer needed ~38 GB), and the archive is written through a temporary
# directory too; after the archive, NO_LAYER_CACHE leaves the archive alone.
DISK_NEEDED = {"trainer-gpu": 34 * GiB}
# Images whose layers are not kept as cache after their archive is written (a rebuild is cold): the
# GPU trainer's layers would hold ~11 GB of buildah's storage for a check that runs rarely.
NO_LAYER_CACHE = {"trainer-gpu"}
DISK_POLL_S = 5.0
# uncompressed layers: containerd imports them without gunzip, and the trainer's ~6 GB of torch
# and CUDA libraries compress little for minutes of the 2 cores
PUSH_FLAGS = ["--disable-compression"]


class ImageError(RuntimeError):
    """An image could not be built; the message says which step and what to do."""


@dataclass(frozen=True)
class Image:
    name: str  # the directory under images/
    ref: str  # what the chart and the operator call it
    archive: Path  # OCI archive in the cache
    key: str


def images_cache() -> Path:
    return cache_root() / "images"


def app_version() -> str:
    return yaml.safe_load((REPO / "charts" / "toolrl-operator" / "Chart.yaml").read_text())["appVersion"]


def dockerfile_of(name: str) -> Path:
    dockerfile = IMAGES_DIR / VARIANTS.get(name, name) / "Dockerfile"
    if not dockerfile.is_file():
        known = ", ".join(sorted([p.parent.name for p in IMAGES_DIR.glob("*/Dockerfile")] + list(VARIANTS)))
        raise ImageError(f"no image named {name!r}: images/ has {known}")
    return dockerfile


def image_ref(name: str) -> str:
    """docker.io/library/... is how containerd's CRI names `toolrl-<name>:<tag>`."""
    return f"docker.io/library/toolrl-{name}:{app_version()}"


def _check_tools() -> None:
    missing = [f"{cmd} (Debian package `{pkg}`)" for cmd, pkg in TOOLS.items() if shutil.which(cmd) is None]
    if missing:
        raise ImageError(f"cannot build images: missing {', '.join(missing)}; `make setup` installs them")


def _free() -> int:
    images_cache().mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(images_cache()).free


def min_free() -> int:
    """The free space a build must leave on the cache's disk: kubelet's eviction threshold there (the
    node's evictionHard, EVICTION_FREE_PERCENT of the disk) and BUILD_MARGIN."""
    images_cache().mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(images_cache()).total * EVICTION_FREE_PERCENT // 100 + BUILD_MARGIN


def build_tmp() -> Path:
    """buildah's temporary directory (TMPDIR): its copies of layers and archives while it builds. A
    killed build leaves them behind (44 GB in /var/tmp after a few killed trainer builds here), so each
    build empties this one first."""
    return images_cache() / "tmp"


def build_env() -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(build_tmp())}


def _run(cmd: list[str], log: Path) -> None:
    """Run a build step into `log`; kill it if the disk's free space falls under min_free()."""
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        build_tmp().mkdir(parents=True, exist_ok=True)
        floor = min_free()
        proc = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=build_env()
        )
        while True:
            try:
                rc = proc.wait(timeout=DISK_POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            free = _free()
            if free >= floor:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise ImageError(
                f"`{' '.join(cmd[:3])} ...` stopped: {free / GiB:.1f} GiB free on the disk of "
                f"{images_cache()}, under the {floor / GiB:.1f} GiB a build must leave (with less the real "
                "node's kubelet evicts pods); free space and build again"
            )
    if rc:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise ImageError(f"`{' '.join(cmd[:3])} ...` failed (exit {rc}); last lines of {log}:\n{tail}")


def base_key() -> str:
    version = subprocess.run(["mmdebstrap", "--version"], capture_output=True, text=True).stdout.strip()
    spec = json.dumps({"suite": SUITE, "packages": BASE_PACKAGES, "hooks": BASE_HOOKS, "mmdebstrap": version})
    return hashlib.sha256(spec.encode()).hexdigest()[:12]


def ensure_base(log_dir: Path) -> Path:
    """The Debian base as an OCI archive (cached by its key)."""
    _check_tools()
    key = base_key()
    out = images_cache() / f"base-{key}.tar"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    rootfs = out.with_suffix(".rootfs.tar")
    cmd = ["mmdebstrap", "--variant=minbase", "--include=" + ",".join(BASE_PACKAGES)]
    cmd += [f"--customize-hook={hook}" for hook in BASE_HOOKS]
    cmd += [SUITE, str(rootfs)]
    _run(cmd, log_dir / "base.log")
    config = {
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"],
        "Cmd": ["python3"],
    }
    write_oci_archive(rootfs, config, f"{BASE_REF}:{key}", out)
    rootfs.unlink()
    return out


def _copy_sources(dockerfile: Path) -> list[Path]:
    """Repository paths the Dockerfile's COPY lines bring in (not COPY --from=stage)."""
    sources = []
    for line in dockerfile.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["COPY"] and not any(p.startswith("--from") for p in parts):
            sources += [REPO / p for p in parts[1:-1] if not p.startswith("--")]
    return sources


def _ignored(rel: Path) -> bool:
    """Whether the repository's .dockerignore keeps `rel` out of the build context (its `**/name`
    and `path` lines, the forms it uses). A host-built `_spawner.so` changed the tool-sandbox key
    on every `make setup` before."""
    patterns = [ln for ln in (REPO / ".dockerignore").read_text().splitlines() if ln and ln[0] != "#"]
    for i, part in enumerate(rel.parts, 1):
        prefix = "/".join(rel.parts[:i])
        for pattern in patterns:
            anywhere = pattern.startswith("**/")
            if fnmatch.fnmatch(part if anywhere else prefix, pattern.removeprefix("**/")):
                return True
    return False


def _tree_digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for root in sorted(paths):
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for f in files:
            rel = f.relative_to(REPO)
            if not _ignored(rel):
                h.update(str(rel).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def image_key(name: str, base: Path, build_args: dict[str, str]) -> str:
    dockerfile = dockerfile_of(name)
    spec = {
        "dockerfile": dockerfile.read_text(),
        "sources": _tree_digest(_copy_sources(dockerfile)),
        "base": base.name,
        "args": build_args,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def _buildah(*args: str) -> list[str]:
    """buildah with its storage in the cache (not the host's /var/lib/containers)."""
    store = images_cache() / "storage"
    return ["buildah", "--root", str(store), "--runroot", str(images_cache() / "run"), *args]


def stages(dockerfile: Path) -> list[str]:
    """The named stages before the last one (`FROM ... AS name`): what COPY --from takes, whose
    layers the next build of the image reuses."""
    named = []
    for line in dockerfile.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["FROM"]:
            named.append(parts[3] if len(parts) == 4 and parts[2].upper() == "AS" else None)
    return [n for n in named[:-1] if n]


def stage_tag(tag: str, stage: str) -> str:
    return f"{tag}.{stage}"


def stale_tags(listed: list[str], tag: str, keep: set[str]) -> list[str]:
    """Tags of earlier builds of the image tagged `tag` (`<ref>-<key>`, its stages `<ref>-<key>.<stage>`):
    every `<ref>-...` but those in `keep`; another image's (`toolrl-trainer-gpu` beside `toolrl-trainer`)
    never, their names differ before the `:`."""
    stem = tag.rsplit("-", 1)[0] + "-"
    return [ref for ref in listed if ref.startswith(stem) and ref not in keep]


def kept_tags(name: str, tag: str, stages: list[str]) -> set[str]:
    """What stays tagged in buildah's storage after `name` was built as `tag`: the image and its stages
    (the next build's cache), or nothing for NO_LAYER_CACHE (its archive is what is used)."""
    if name in NO_LAYER_CACHE:
        return set()
    return {tag, *(stage_tag(tag, s) for s in stages)}


def stale_archives(files: list[str], name: str, current: str) -> list[str]:
    """Archives of earlier keys of `name` (`<name>-<key>.tar`), not another image's whose name it
    begins (`trainer-gpu-<key>.tar` is not the trainer's)."""
    pattern = re.compile(re.escape(name) + r"-[0-9a-f]{12}\.tar")
    return [f for f in files if pattern.fullmatch(f) and f != current]


@contextlib.contextmanager
def _storage_lock():
    """One build (and prune) at a time in buildah's storage: a prune beside another process's build
    could remove the untagged image its next step starts from."""
    images_cache().mkdir(parents=True, exist_ok=True)
    with (images_cache() / "build.lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _remove_older(name: str, archive: Path, tag: str, keep: set[str]) -> None:
    """Drop what earlier inputs of `name` left: their archives and their tags in buildah's storage
    (the trainer's final layer is a 6.5 GB copy of its venv per build; storage reached 46 GB after a
    day of builds here)."""
    for old in stale_archives([p.name for p in images_cache().glob("*.tar")], name, archive.name):
        (images_cache() / old).unlink()
    names = _buildah("images", "--format", "{{.Name}}:{{.Tag}}")
    listed = subprocess.run(names, capture_output=True, text=True)
    for ref in stale_tags(listed.stdout.split(), tag, keep):
        subprocess.run(_buildah("rmi", ref), capture_output=True)


def remove_working_containers() -> int:
    """Remove the working containers a killed build left (`--force-rm` cleans up only after a build
    that failed, not one that was killed): each pins its image and whatever its step wrote (16 of
    them held 14 GB here). Called under _storage_lock, where no other build of this code runs."""
    res = subprocess.run(_buildah("rm", "--all"), capture_output=True, text=True)
    return len(res.stdout.split()) if res.returncode == 0 else 0


def prune_untagged(max_rounds: int = 100) -> int:
    """Remove every untagged image that no tagged image builds on (stale stages, layers of earlier
    inputs, what a failed build left). `rmi --prune` removes the untagged images without children, so
    a chain goes one image per round; returns how many went."""
    removed = 0
    for _ in range(max_rounds):
        res = subprocess.run(_buildah("rmi", "--prune"), capture_output=True, text=True)
        gone = res.stdout.split()
        if res.returncode or not gone:
            break
        removed += len(gone)
    return removed


def _build_cmd(name: str, build_args: dict[str, str]) -> list[str]:
    volumes = [f"{HOST_CA}:{HOST_CA}:ro"]
    if build_args.get("UV_NO_CACHE") == "0":
        HOST_UV_CACHE.mkdir(parents=True, exist_ok=True)
        volumes.append(f"{HOST_UV_CACHE}:/root/.cache/uv")
    # --force-rm: a failed build's working containers would otherwise pin their layers (GBs)
    cmd = _buildah("bud", "--isolation", "chroot", "--layers", "--force-rm", "--pull-never", "-f")
    cmd.append(str(dockerfile_of(name)))
    for k, v in build_args.items():
        cmd += ["--build-arg", f"{k}={v}"]
    for v in volumes:
        cmd += ["-v", v]
    return cmd


def ensure_image(name: str, log=print) -> Image:
    """The image `name` (a directory of images/, or a VARIANTS name) as an OCI archive, built if its
    key changed."""
    dockerfile = dockerfile_of(name)
    log_dir = images_cache() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    base = ensure_base(log_dir)
    extra = EXTRA_BUILD_ARGS.get(name, {})
    build_args = {"BASE_IMAGE": f"oci-archive:{base}", **{k: v.format(base=base) for k, v in extra.items()}}
    key = image_key(name, base, {**extra, "push": PUSH_FLAGS})
    ref = image_ref(name)
    out = images_cache() / f"{name}-{key}.tar"
    if out.is_file():
        return Image(name, ref, out, key)
    with _storage_lock():
        if out.is_file():  # built by another process while this one waited
            return Image(name, ref, out, key)
        return _build(name, dockerfile, build_args, key, out, log)


def _build(name: str, dockerfile: Path, build_args: dict[str, str], key: str, out: Path, log=print) -> Image:
    ref = image_ref(name)
    log_dir = images_cache() / "logs"
    remove_working_containers()
    shutil.rmtree(build_tmp(), ignore_errors=True)  # what killed builds left (we hold the storage lock)
    floor = min_free()
    need = DISK_NEEDED.get(name, 0) + floor
    if _free() < need:
        raise ImageError(
            f"not building {name}: needs about {need / GiB:.0f} GiB free on the disk of {images_cache()} "
            f"({DISK_NEEDED.get(name, 0) // GiB} GiB for the build, {floor / GiB:.1f} GiB left over), "
            f"{_free() / GiB:.1f} GiB are; free space first"
        )
    log(f"images: building {name} (key {key}; log {log_dir / (name + '.log')})")
    started = time.monotonic()
    tag = f"{ref}-{key}"
    cmd = _build_cmd(name, build_args)
    logfile = log_dir / f"{name}.log"
    logfile.write_text("")
    _run([*cmd, "-t", tag, str(REPO)], logfile)
    partial = out.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    try:
        _run(_buildah("push", *PUSH_FLAGS, tag, f"oci-archive:{partial}:{ref}"), logfile)
    except ImageError:
        partial.unlink(missing_ok=True)  # the size of the image, of no use
        raise
    partial.rename(out)
    built = time.monotonic() - started
    # the stages again, all from the layer cache: a tag keeps their layers for the next build
    keep = kept_tags(name, tag, stages(dockerfile))
    for stage in stages(dockerfile):
        if stage_tag(tag, stage) in keep:
            _run([*cmd, "--target", stage, "-t", stage_tag(tag, stage), str(REPO)], logfile)
    _remove_older(name, out, tag, keep)
    before = _free()
    pruned = prune_untagged()
    log(
        f"images: {name} built in {built:.0f}s, {out.stat().st_size >> 20} MiB; pruned {pruned} untagged "
        f"images of earlier builds ({(_free() - before) / GiB:+.1f} GiB free)"
    )
    return Image(name, ref, out, key)
