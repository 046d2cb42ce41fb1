"""Operator-wide settings; the environment (set by the Helm chart) is their one home."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    trainer_image: str = "toolrl-trainer:0.1.0"
    tool_sandbox_image: str = "toolrl-tool-sandbox:0.1.0"
    monitoring_namespace: str = "monitoring"
    field_manager: str = "toolrl-operator"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        """Read TOOLRL_TRAINER_IMAGE, TOOLRL_TOOL_SANDBOX_IMAGE, TOOLRL_MONITORING_NAMESPACE."""
        env = dict(os.environ) if env is None else env
        defaults = cls()
        return cls(
            trainer_image=env.get("TOOLRL_TRAINER_IMAGE") or defaults.trainer_image,
            tool_sandbox_image=env.get("TOOLRL_TOOL_SANDBOX_IMAGE") or defaults.tool_sandbox_image,
            monitoring_namespace=env.get("TOOLRL_MONITORING_NAMESPACE") or defaults.monitoring_namespace,
        )
