"""A call of a tool as the service takes it, whichever protocol it came in by, and the error that
refuses one: shared by the service and every protocol (api/*)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class RequestError(ValueError):
    """Answered with 400 (or `status`) and this message."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class ExecuteRequest:
    tool: str
    input: Any
    timeout: float | None
    session: str | None
    sample: dict[str, Any] | None = None  # per-sample data from the trainer, never the model's


def shown(value: Any, chars: int = 40) -> str:
    """A value for an error message, cut short (a number can have thousands of digits)."""
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 128 else str(value)[: chars + 1]
    return text if len(text) <= chars else text[:chars] + "..."
