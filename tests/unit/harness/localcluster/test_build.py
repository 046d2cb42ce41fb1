"""The build cache: clear errors when Go or the module proxy is missing; a partial or corrupt
cache is detected and rebuilt rather than used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness.localcluster import build


def fake_cache(root: Path) -> Path:
    bin_dir = root / build.cache_key() / "bin"
    (bin_dir / "crds").mkdir(parents=True)
    (bin_dir / "crds" / "ray.io_rayjobs.yaml").write_text("kind: CustomResourceDefinition\n")
    for name in build.BINARIES:
        (bin_dir / name).write_bytes(f"binary {name}".encode())
    manifest = {
        "binaries": {n: build._sha256(bin_dir / n) for n in build.BINARIES},
        "sizes": {n: (bin_dir / n).stat().st_size for n in build.BINARIES},
    }
    (bin_dir / "manifest.json").write_text(json.dumps(manifest))
    return bin_dir


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TOOLRL_CACHE", str(tmp_path))
    return tmp_path


def test_complete_cache_is_used(cache: Path) -> None:
    bin_dir = fake_cache(cache)
    assert build.ensure_built(verbose=False).bin_dir == bin_dir


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "manifest"])
def test_damaged_cache_is_rebuilt(cache: Path, monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    bin_dir = fake_cache(cache)
    target = bin_dir / "kube-apiserver"
    if damage == "truncate":
        target.write_bytes(b"bin")
    elif damage == "flip":
        target.write_bytes(target.read_bytes().upper())
    elif damage == "delete":
        target.unlink()
    else:
        (bin_dir / "manifest.json").write_text("{not json")
    # an unreachable proxy stops the rebuild right after the damaged cache is thrown away
    monkeypatch.setenv("GOPROXY", "http://127.0.0.1:9")
    with pytest.raises(build.BuildError, match="cannot reach the Go module proxy"):
        build.ensure_built(verbose=False)
    assert not bin_dir.exists()


def test_missing_go_is_a_clear_error(cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(build.BuildError, match=r"Go is not installed.*Install Go"):
        build.ensure_built(verbose=False)


def test_proxy_without_http_is_a_clear_error(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOPROXY", "off")
    with pytest.raises(build.BuildError, match="names no HTTP module proxy"):
        build.ensure_built(verbose=False)


def test_staging_replaces_come_from_the_release_go_mod() -> None:
    gomod = (
        "module k8s.io/kubernetes\n\nreplace (\n"
        "\tk8s.io/api => ./staging/src/k8s.io/api\n"
        "\tk8s.io/client-go => ./staging/src/k8s.io/client-go\n"
        "\tgithub.com/other/mod => github.com/other/mod v1.0.0\n)\n"
    )
    assert build.staging_replaces(gomod, "v1.36.3") == {
        "k8s.io/api": "v0.36.3",
        "k8s.io/client-go": "v0.36.3",
    }
    text = build.wrapper_gomod(
        {"k8s.io/api": "v0.36.3", "k8s.io/sample-x": "v0.36.3"}, "1.26.0", frozenset({"k8s.io/sample-x"})
    )
    assert "\tk8s.io/api => k8s.io/api v0.36.3" in text
    assert "\tk8s.io/sample-x => ./stubs/k8s.io/sample-x" in text
    assert "\tk8s.io/sample-x v0.36.3" not in text


def test_version_is_stamped_for_clients_that_check_it() -> None:
    flags = build._ldflags()
    assert "-X k8s.io/component-base/version.gitVersion=" + build.KUBERNETES in flags
    minor = build.KUBERNETES.split(".")[1]
    assert f"-X k8s.io/client-go/pkg/version.gitMinor={minor}" in flags


def test_a_second_build_waits_for_the_first_and_uses_its_result(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test's fixture asking for the toolchain while `make setup` builds it waits, then finds the
    cache the first build wrote: one build, never two writing the same staging directory."""
    import threading

    builds: list[str] = []
    building = threading.Event()
    release = threading.Event()

    def slow_build(*args: object, **kwargs: object) -> dict:
        builds.append("build")
        building.set()
        release.wait(10)
        fake_cache(cache)
        return {"buildSeconds": 0.0}

    monkeypatch.setattr(build, "_write_k8s_wrapper", lambda *a, **k: "go 1.26")
    monkeypatch.setattr(build, "_write_single_wrapper", lambda *a, **k: None)
    monkeypatch.setattr(build, "_build_all", slow_build)
    monkeypatch.setattr(build, "_ensure_assets", lambda *a, **k: None)
    results: list[Path] = []
    first = threading.Thread(target=lambda: results.append(build.ensure_built(verbose=False).bin_dir))
    first.start()
    assert building.wait(10)
    second = threading.Thread(target=lambda: results.append(build.ensure_built(verbose=False).bin_dir))
    second.start()
    second.join(0.5)
    assert second.is_alive(), "the second caller did not wait for the build under way"
    release.set()
    first.join(10)
    second.join(10)
    assert builds == ["build"] and results == [cache / build.cache_key() / "bin"] * 2, (builds, results)


def test_kube_router_is_one_exact_version_stamped_and_cached_apart() -> None:
    assert build.KUBE_ROUTER == "v2.1.0"  # the version the module proxy serves here (test-only)
    assert f"pkg/version.Version={build.KUBE_ROUTER}" in build.kube_router_ldflags()
    assert "kube-router" not in build.NODE_BINARIES  # adding it did not rebuild kubelet and the rest
