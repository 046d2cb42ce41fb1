"""The harness and the chart generator are installed packages: importable from anywhere, with no
sys.path or PYTHONPATH edits left in the repository."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from harness import REPO

PATH_EDIT = re.compile(r"sys\.path\.(insert|append)|PYTHONPATH=")


def test_the_harness_imports_from_another_directory(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import harness.localcluster, harness.operator_process, harness.sandbox_process, chartgen"
    result = subprocess.run(
        [sys.executable, "-c", code + "; print('ok')"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr


# Where no install can do it: the GPU machine's python3 is itself a venv's (a venv over it does not see
# its torch), so the wheels the bundle carries, installed with pip --target, reach it through PYTHONPATH
PATH_EDIT_ALLOWED = {"examples/gpu-smoke/bundle/device.sh"}


def test_no_file_edits_the_import_path() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    found = []
    for name in tracked.stdout.splitlines():
        path = REPO / name
        if path.suffix in (".py", ".sh") or path.name == "Makefile":
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if PATH_EDIT.search(line) and "PATH_EDIT" not in line and name not in PATH_EDIT_ALLOWED:
                    found.append(f"{name}:{number}: {line.strip()}")
    assert not found, "import path edits (install the package editable instead):\n" + "\n".join(found)
