"""Helpers for the book's pages: put numbers computed by code, and words computed from numbers,
into the prose.

`glue(name, value)` hands a value to MyST-NB so the Markdown can say {glue:text}`name:,` instead of
a hand-typed number. Outside a book build (Colab, a plain Jupyter) MyST-NB may be absent; then the
value is simply returned, because the same cell's printed output already shows it.

Words that interpret a measurement are built from the numbers too: `compare_speed` says which of two
is faster and by how much, and `verdict` shows an interpretation only when the consistency checks
found nothing, and otherwise says what was inconsistent and withholds it. `Table` renders a table
in a chapter and `markdown_table` one in a one-pager. `solved_by` runs a coding exercise: the
reader's function when it is written, the book's solution while it is not.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from html import escape
from typing import TypeVar

from mlsys import checks

T = TypeVar("T")


def glue(name: str, value: T) -> T:
    """Register `value` under `name` for MyST-NB's {glue} roles (without displaying it); return
    it."""
    if not name.isidentifier():
        raise ValueError(f"glue name={name!r} must be a Python identifier "
                         "(letters, digits, underscores)")
    if importlib.util.find_spec("myst_nb") is not None:
        from myst_nb import glue as _myst_glue  # optional: only a book build has MyST-NB

        _myst_glue(name, value, display=False)
    return value


def solved_by(yours: Callable[..., T], ours: Callable[..., T], *args, **kwargs) -> tuple[T, str]:
    """(result, whose) of a coding exercise: `yours(*args, **kwargs)`, the reader's function, and
    "yours"; or, while its body still raises `NotImplementedError`, `ours(...)` (the book's hidden
    solution) and "the book's". The chapter then asserts on the result, whichever wrote it.

    Any other exception from the reader's code propagates: a wrong attempt fails loudly.
    """
    if not (callable(yours) and callable(ours)):
        raise TypeError(f"yours ({yours!r}) and ours ({ours!r}) must both be functions")
    try:
        return yours(*args, **kwargs), "yours"
    except NotImplementedError:
        return ours(*args, **kwargs), "the book's"


def compare_speed(name_a: str, seconds_a: float, name_b: str, seconds_b: float, *,
                  tie: float = 1.1) -> str:
    """"A is 2.3x faster than B", "A is 1.5x slower than B", or "A and B take the same time (within
    10%)" when the ratio is within `tie`; computed from the two times."""
    checks.positive(seconds_a, "seconds_a")
    checks.positive(seconds_b, "seconds_b")
    checks.number(tie, "tie", minimum=1.0)
    ratio = seconds_b / seconds_a
    if 1 / tie <= ratio <= tie:
        return f"{name_a} and {name_b} take the same time (within {tie - 1:.0%}: {ratio:.2f}x)"
    if ratio > 1:
        return f"{name_a} is {ratio:.2f}x faster than {name_b}"
    return f"{name_a} is {1 / ratio:.2f}x slower than {name_b}"


SHOWN_PROBLEMS = 2
"""A withheld verdict names this many of the problems found, then counts the rest."""


def verdict(text: str, problems: list[str] | tuple[str, ...]) -> str:
    """`text` when `problems` is empty; otherwise a sentence that withholds it and lists the
    problems.

    Chapters pass the consistency checks' findings, so a noisy machine never shows a verdict that
    its own numbers contradict: the numbers stay on the page, the interpretation does not.
    """
    if not problems:
        return text
    listed = "; ".join(problems[:SHOWN_PROBLEMS])
    if len(problems) > SHOWN_PROBLEMS:
        listed += f"; and {len(problems) - SHOWN_PROBLEMS} more"
    return f"no verdict: the machine was too noisy for one ({listed})"


def num(x: float, digits: int = 3) -> str:
    """`x` to `digits` significant digits, with thousands separators instead of an exponent
    between 10**digits and 1e15: num(0.012345) = "0.0123", num(4.5678) = "4.57",
    num(123456) = "123,456". `x`: a real number (a NumPy or 0-d torch scalar too; NaN and inf
    print as "nan", "inf"); strings and bools are refused."""
    digits = checks.positive_int(digits, "digits")
    if isinstance(x, (str, bytes, bool)):
        raise TypeError(f"x must be a real number, got {x!r} ({type(x).__name__})")
    try:
        x = float(x)
    except (TypeError, ValueError):
        raise TypeError(f"x must be a real number, got {x!r} ({type(x).__name__})") from None
    if 10**digits <= abs(x) < 1e15:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def markdown_table(header: list[object], rows: list[list[object]]) -> str:
    """A MyST/GitHub Markdown table (for a one-pager cell that prints Markdown); cells via
    `str()`."""
    Table(header, rows)  # the same width checks as Table
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


class Table:
    """A small table that renders as HTML in the book and in Jupyter, and as aligned text in a
    terminal.

    Cells are shown with `str()`; format numbers before passing them in. Text in backticks is
    rendered as code in HTML.
    """

    def __init__(self, header: list[object], rows: list[list[object]]):
        self.header = [str(h) for h in header]
        self.rows = [[str(c) for c in row] for row in rows]
        for i, row in enumerate(self.rows):
            if len(row) != len(self.header):
                raise ValueError(f"row {i} has {len(row)} cells for {len(self.header)} columns")

    def _repr_html_(self) -> str:
        def html(text: str) -> str:
            return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text))

        cell = 'style="padding:0.15em 0.6em; text-align:left"'  # cells wrap: nothing is cut
        head = "".join(f"<th {cell}>{html(h)}</th>" for h in self.header)
        body = "".join("<tr>" + "".join(f"<td {cell}>{html(c)}</td>" for c in row) + "</tr>"
                       for row in self.rows)
        table = (f'<table style="font-size:0.85em"><thead><tr>{head}</tr></thead>'
                 f'<tbody>{body}</tbody></table>')
        return f'<div style="overflow-x:auto">{table}</div>'

    def __repr__(self) -> str:
        lines = [self.header, *self.rows]
        widths = [max(len(r[i]) for r in lines) for i in range(len(self.header))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))
                         for r in lines)
