"""Fixtures: the tiny local model and a real tool_sandbox server process (nothing is downloaded)."""

from pathlib import Path

import pytest
from harness.sandbox_process import SandboxProcess
from harness.tiers import process_tier
from trainer_entry.tiny_model import build_tiny_model


@pytest.fixture(scope="session")
@process_tier
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model"))


SANDBOX_TOOLS = [
    {"name": "python", "type": "python", "timeoutSeconds": 1, "memoryLimitMiB": 256, "maxOutputBytes": 4096}
]


@pytest.fixture(scope="session")
@process_tier
def sandbox(tmp_path_factory):
    """A real tool_sandbox server process; yields its base URL."""
    with SandboxProcess.start(tmp_path_factory.mktemp("sandbox"), tools=SANDBOX_TOOLS) as server:
        yield server.url
