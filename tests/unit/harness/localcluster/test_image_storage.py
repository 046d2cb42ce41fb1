"""buildah's storage stays bounded and a build never fills the disk: which tags and archives of earlier
builds go, which stages are kept as cache, the disk guard that kills a build, the GPU variant's
up-front check. No buildah runs here."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from harness.localcluster import images, node

REF = "docker.io/library/toolrl-trainer:0.1.0"
GPU_REF = "docker.io/library/toolrl-trainer-gpu:0.1.0"
OLD, NEW = "0123456789ab", "ba9876543210"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TOOLRL_CACHE", str(tmp_path))
    return tmp_path / "images"


def test_stages_kept_as_cache_are_the_named_ones_before_the_last() -> None:
    for name in images.ALL_IMAGES:
        # the trainer is one stage: its GBs of venv written once (images/trainer/Dockerfile)
        assert images.stages(images.dockerfile_of(name)) == ([] if name == "trainer" else ["build"]), name


def test_stages_of_a_dockerfile_with_unnamed_and_several_stages(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM a AS deps\nRUN x\nFROM b\nFROM c as wheels\nFROM d AS final\n")
    assert images.stages(dockerfile) == ["deps", "wheels"]


def test_stale_tags_are_earlier_keys_and_their_stages_only() -> None:
    tag = f"{REF}-{NEW}"
    keep = {tag, images.stage_tag(tag, "build")}
    listed = [
        tag,
        images.stage_tag(tag, "build"),
        f"{REF}-{OLD}",
        images.stage_tag(f"{REF}-{OLD}", "build"),
        f"{GPU_REF}-{OLD}",  # the GPU variant's: another image
        images.stage_tag(f"{GPU_REF}-{OLD}", "build"),
        f"docker.io/library/toolrl-operator:0.1.0-{OLD}",
        "localhost/toolrl/debian-python:dc75bce7ede9",
    ]
    assert images.stale_tags(listed, tag, keep) == [f"{REF}-{OLD}", images.stage_tag(f"{REF}-{OLD}", "build")]
    gpu_tag = f"{GPU_REF}-{NEW}"
    assert images.stale_tags(listed, gpu_tag, {gpu_tag}) == [
        f"{GPU_REF}-{OLD}",
        images.stage_tag(f"{GPU_REF}-{OLD}", "build"),
    ]


def test_stale_archives_leave_another_image_whose_name_begins_the_same() -> None:
    files = [f"trainer-{OLD}.tar", f"trainer-{NEW}.tar", f"trainer-gpu-{OLD}.tar", "base-dc75bce7ede9.tar"]
    assert images.stale_archives(files, "trainer", f"trainer-{NEW}.tar") == [f"trainer-{OLD}.tar"]
    assert images.stale_archives(files, "trainer-gpu", f"trainer-gpu-{NEW}.tar") == [f"trainer-gpu-{OLD}.tar"]


def test_variants_build_only_when_named() -> None:
    assert "trainer-gpu" not in images.ALL_IMAGES
    assert images.dockerfile_of("trainer-gpu") == images.IMAGES_DIR / "trainer" / "Dockerfile"
    assert images.EXTRA_BUILD_ARGS["trainer-gpu"]["VARIANT"] == "gpu"
    with pytest.raises(images.ImageError, match=r"no image named 'trainer-cuda': images/ has .*trainer-gpu"):
        images.dockerfile_of("trainer-cuda")


def test_prune_repeats_until_no_untagged_image_is_left(monkeypatch: pytest.MonkeyPatch) -> None:
    rounds = iter(["a1\nb1\n", "a2\n", "a3\n", ""])
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd[-2:])
        return subprocess.CompletedProcess(cmd, 0, stdout=next(rounds), stderr="")

    monkeypatch.setattr(images.subprocess, "run", fake_run)
    assert images.prune_untagged() == 4
    assert calls == [["rmi", "--prune"]] * 4


def test_a_build_is_killed_when_free_space_falls_under_the_floor(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(images, "DISK_POLL_S", 0.2)
    monkeypatch.setattr(images, "min_free", lambda: 6 * images.GiB)
    monkeypatch.setattr(images, "_free", lambda: 5 * images.GiB)
    started = time.monotonic()
    with pytest.raises(images.ImageError, match=r"stopped: 5\.0 GiB free .* under the 6\.0 GiB"):
        images._run(["sleep", "120"], tmp_path / "build.log")
    assert time.monotonic() - started < 60
    assert "$ sleep 120" in (tmp_path / "build.log").read_text()


def test_a_build_leaves_what_the_nodes_kubelet_needs_before_it_evicts(cache: Path) -> None:
    """The floor is the real node's evictionHard share of the disk (one number, node.py) and a margin."""
    floor = images.min_free()
    assert floor == shutil.disk_usage(cache).total * node.EVICTION_FREE_PERCENT // 100 + images.BUILD_MARGIN


def test_a_build_with_room_runs_to_its_end(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(images, "DISK_POLL_S", 0.2)
    monkeypatch.setattr(images, "_free", lambda: images.min_free() + images.GiB)
    images._run(["sh", "-c", "sleep 1; echo done"], tmp_path / "build.log")
    assert (tmp_path / "build.log").read_text().endswith("done\n")
    with pytest.raises(images.ImageError, match="failed \\(exit 3\\)"):
        images._run(["sh", "-c", "exit 3"], tmp_path / "build.log")


def test_the_gpu_variant_is_not_started_without_room(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = cache / "base-000000000000.tar"
    monkeypatch.setattr(images, "ensure_base", lambda log_dir: base)
    monkeypatch.setattr(images, "_free", lambda: 30 * images.GiB)
    monkeypatch.setattr(images, "_run", lambda *a: pytest.fail("a build started"))
    with pytest.raises(images.ImageError, match=r"not building trainer-gpu: needs about 40 GiB .* 30\.0 GiB"):
        images.ensure_image("trainer-gpu")


def test_kept_tags_are_the_image_and_its_stages_but_none_of_the_gpu_variant() -> None:
    tag = f"{REF}-{NEW}"
    assert images.kept_tags("trainer", tag, ["build"]) == {tag, images.stage_tag(tag, "build")}
    gpu_tag = f"{GPU_REF}-{NEW}"
    assert images.kept_tags("trainer-gpu", gpu_tag, ["build"]) == set()
    # so every tag of the GPU variant goes once its archive is written, the current one too
    assert images.stale_tags([gpu_tag, images.stage_tag(gpu_tag, "build"), tag], gpu_tag, set()) == [
        gpu_tag,
        images.stage_tag(gpu_tag, "build"),
    ]


def test_a_build_frees_what_killed_builds_left_first_and_prunes_after(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order of the storage steps around a build (buildah faked): working containers of killed
    builds go before the room is checked; the stage is tagged, older tags go, then the prune."""
    steps: list[str] = []
    tag = f"{REF}-{NEW}"
    listed = f"{tag}\n{REF}-{OLD}\n{images.stage_tag(REF + '-' + OLD, 'build')}\n"

    def fake_run(cmd, **kwargs):
        args = cmd[cmd.index("--runroot") + 2 :]
        steps.append(" ".join(args[:2]) if args[0] != "rmi" else f"rmi {args[1]}")
        outputs = {"rm": "c1\nc2\n", "images": listed, "rmi": ""}
        return subprocess.CompletedProcess(cmd, 0, stdout=outputs.get(args[0], ""), stderr="")

    def fake_build_step(cmd, log):
        if cmd[cmd.index("--runroot") + 2] == "push":
            Path(cmd[-1].split(":")[1]).write_bytes(b"archive")
            steps.append("push")
        else:
            steps.append("bud --target " + cmd[cmd.index("--target") + 1] if "--target" in cmd else "bud")

    frees = iter([100 * images.GiB] * 10)
    monkeypatch.setattr(images.subprocess, "run", fake_run)
    monkeypatch.setattr(images, "_run", fake_build_step)
    monkeypatch.setattr(images, "_free", lambda: next(frees))
    cache.mkdir(parents=True)
    (cache / f"trainer-{OLD}.tar").write_bytes(b"old")
    (cache / "logs").mkdir()
    out = cache / f"trainer-{NEW}.tar"
    two_stages = cache / "Dockerfile"  # a build stage, whose layers are kept as the next build's cache
    two_stages.write_text("FROM base AS build\nRUN make\nFROM base\nCOPY --from=build /out /out\n")
    images._build("trainer", two_stages, {}, NEW, out, log=lambda msg: None)
    assert steps == [
        "rm --all",
        "bud",
        "push",
        "bud --target build",
        "images --format",
        f"rmi {REF}-{OLD}",
        f"rmi {images.stage_tag(REF + '-' + OLD, 'build')}",
        "rmi --prune",
    ]
    assert out.read_bytes() == b"archive" and not (cache / f"trainer-{OLD}.tar").exists()


def test_buildah_keeps_its_temporary_files_in_the_images_cache(monkeypatch, tmp_path):
    """A killed build left its layer copies in /var/tmp (buildah's default): 44 GB here, filling the disk."""
    monkeypatch.setattr(images, "images_cache", lambda: tmp_path)
    assert images.build_env()["TMPDIR"] == str(tmp_path / "tmp")
    log = tmp_path / "log"
    images._run(["sh", "-c", 'test "$TMPDIR" = "$0" && touch "$TMPDIR/seen"', str(images.build_tmp())], log)
    assert (images.build_tmp() / "seen").exists(), log.read_text()
