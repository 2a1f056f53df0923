"""Helpers for the book's pages: put numbers computed by code into the prose.

`glue(name, value)` hands a value to MyST-NB so the Markdown can say {glue:text}`name:,` instead of
a hand-typed number. Outside a book build (Colab, a plain Jupyter) MyST-NB may be absent; then the
value is simply returned, because the same cell's printed output already shows it.
"""

from __future__ import annotations

import importlib.util
from typing import TypeVar

T = TypeVar("T")


def glue(name: str, value: T) -> T:
    """Register `value` under `name` for MyST-NB's {glue} roles (without displaying it); return it."""
    if not name.isidentifier():
        raise ValueError(f"glue name={name!r} must be a Python identifier (letters, digits, underscores)")
    if importlib.util.find_spec("myst_nb") is not None:
        from myst_nb import glue as _myst_glue

        _myst_glue(name, value, display=False)
    return value
