"""Parsing the repository's own Python for the structure tests."""

from __future__ import annotations

import ast


def parse_source(source: str) -> ast.Module:
    """`ast.parse`, asked again when CPython 3.11's AST constructor reports a recursion depth
    mismatch: its depth count can be thrown off by code another thread runs meanwhile (python/
    cpython#106905), which says nothing about the source; a real error repeats."""
    for _ in range(3):
        try:
            return ast.parse(source)
        except SystemError:
            continue
    return ast.parse(source)
