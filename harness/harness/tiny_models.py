"""Warmed-up tiny models for the tests, cached across runs by their inputs, as the images are.

A warm-up (`trainer_entry.tiny_model.warm_up`) is minutes of CPU on 2 cores and, seeded and on one
thread, makes the same model from the same code and arguments. The cache key is everything it reads:
the sources of the modules that render its examples, the tools' schemas as the trainer renders them,
the arguments, and torch's and transformers' versions. Only a warm-up that met its goal (the call and
copy rates it stops at) is kept: one cut short by its time bound on a loaded machine is used once and
tried again next run."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from harness.localcluster.build import cache_root, file_lock

MODEL_NAME = "tiny-qwen2"
RESULT_FILE = "warm-up.json"


def cache_dir() -> Path:
    return cache_root() / "tiny-models"


def warm_up_key(protocol: str, tools: list[dict[str, Any]] | None, hidden: int, layers: int) -> str:
    """The digest of every input of `build_tiny_model` + `warm_up` for these arguments."""
    import torch
    import transformers
    from trainer_entry.translate import tool_schema

    from trainer_entry import data, tiny_model

    spec = {
        "sources": [Path(m.__file__).read_text() for m in (tiny_model, data)],  # type: ignore[arg-type]
        "schemas": [tool_schema(t) for t in tools or [tiny_model.TOY_TOOL]],
        "protocol": protocol,
        "hidden": hidden,
        "layers": layers,
        "versions": [torch.__version__, transformers.__version__],
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def warmed_model(
    root: Path,
    protocol: str,
    tools: list[dict[str, Any]] | None = None,
    hidden: int = 64,
    layers: int = 2,
    seconds: float = 900,
) -> tuple[Path, Any]:
    """`build_tiny_model(root, MODEL_NAME, hidden, layers)` warmed up in `protocol` to call `tools`:
    a copy of the cached one when its inputs were warmed up before, else made now (and cached when
    its warm-up met its goal). Returns the model's directory and the warm-up's `WarmUp`."""
    from trainer_entry.tiny_model import WarmUp, build_tiny_model, warm_up

    key = warm_up_key(protocol, tools, hidden, layers)
    cached = cache_dir() / key
    # one warm-up of a key at a time on the machine: make test's two streams may both want one model;
    # the second waits for the first's and copies it (both would warm up, and share a staging name)
    with file_lock(cache_dir() / f"{key}.lock"):
        if (cached / RESULT_FILE).is_file():
            target = root / MODEL_NAME
            shutil.copytree(cached / MODEL_NAME, target)
            return target, WarmUp(**json.loads((cached / RESULT_FILE).read_text()))
        model = build_tiny_model(root, MODEL_NAME, hidden=hidden, layers=layers)
        result = warm_up(model, protocol, seconds=seconds, tools=tools)
        if result.goal_met:
            staging = cache_dir() / f"{key}.partial"
            shutil.rmtree(staging, ignore_errors=True)
            shutil.copytree(model, staging / MODEL_NAME)
            (staging / RESULT_FILE).write_text(json.dumps(dataclasses.asdict(result)))
            shutil.rmtree(cached, ignore_errors=True)
            staging.rename(cached)
        return model, result
