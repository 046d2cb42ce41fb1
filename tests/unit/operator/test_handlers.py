"""Helpers of the kopf handlers: kopf's read-only views copied to plain data."""

from __future__ import annotations

from toolrl_operator.handlers import plain


def test_plain_copies_nested_views() -> None:
    source = {"a": [{"b": 1}], "c": (2, 3)}
    copied = plain(source)
    assert copied == {"a": [{"b": 1}], "c": [2, 3]}
    copied["a"][0]["b"] = 9
    assert source["a"][0]["b"] == 1
