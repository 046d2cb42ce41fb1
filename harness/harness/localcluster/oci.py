"""OCI image archives written by hand: a rootfs tarball (or a single binary) becomes an image
that `ctr image import` and `buildah from oci-archive:` take. No registry is reachable here, so
the pause image and the Debian base image are made this way."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

# containerd's `ctr import` names an image from this annotation; buildah and skopeo from the OCI one
CONTAINERD_NAME = "io.containerd.image.name"
OCI_REF_NAME = "org.opencontainers.image.ref.name"


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def single_file_layer(src: Path, name: str, out: Path) -> Path:
    """A layer holding one executable at /`name` (owned by root, mode 0755)."""
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tar.gettarinfo(str(src), arcname=name)
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mode = 0o755
        info.mtime = 0
        with src.open("rb") as fh:
            tar.addfile(info, fh)
    return out


def write_oci_archive(layer: Path, image_config: dict, ref: str, out: Path) -> Path:
    """Pack one uncompressed layer tar and an image config (`config` part: Entrypoint, Env, ...)
    into an OCI image-layout tar at `out`, named `ref` (e.g. localhost/toolrl/pause:1)."""
    blobs: dict[str, bytes | Path] = {}

    def add(data: bytes) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": f"sha256:{digest}", "size": len(data)}

    layer_digest = _sha256_file(layer)
    blobs[layer_digest] = layer
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": image_config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        "history": [{"created_by": "toolrl localcluster oci.py"}],
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **add(_json(config))},
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": f"sha256:{layer_digest}",
                "size": layer.stat().st_size,
            }
        ],
    }
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **add(_json(manifest)),
                "annotations": {CONTAINERD_NAME: ref, OCI_REF_NAME: ref},
            }
        ],
    }
    partial = out.with_name(out.name + ".partial")
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
        _add_bytes(tar, "index.json", _json(index))
        for digest, blob in blobs.items():
            if isinstance(blob, Path):
                tar.add(str(blob), arcname=f"blobs/sha256/{digest}")
            else:
                _add_bytes(tar, f"blobs/sha256/{digest}", blob)
    partial.rename(out)
    return out


def _json(obj: dict) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
