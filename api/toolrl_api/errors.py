"""What a validation of the API's classes found, as the operator and the trainer say it."""

from __future__ import annotations

from pydantic import ValidationError


def field_errors(err: ValidationError, root: str = "spec") -> list[str]:
    """`spec.a[0].b: what is wrong`, one line per field that does not fit."""
    lines = []
    for error in err.errors(include_url=False):
        path = root + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
        lines.append(f"{path}: {error['msg']}")
    return lines
