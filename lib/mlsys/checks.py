"""Argument checks shared by every module: one rule, one message, raised before any work starts.

A wrong *type* raises `TypeError`, a wrong *value* `ValueError`; both name the argument, the rule
and what was passed (`n_devices must be an integer >= 1, got 0`). Booleans are not integers here
(`True` is not a size), NaN and infinities are not numbers, and NumPy integers and floats are
accepted like Python's. Pure Python, no torch.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def integer(value: object, name: str, *, minimum: int | None = None) -> int:
    """`value` as an int (>= `minimum` if given); bools, floats and strings are refused."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, "
                        f"got {value!r} ({type(value).__name__})") from None
    if minimum is not None and number < minimum:
        rule = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {rule}, got {number}")
    return number


def positive_int(value: object, name: str) -> int:
    """`value` as an int >= 1."""
    return integer(value, name, minimum=1)


def nonnegative_int(value: object, name: str) -> int:
    """`value` as an int >= 0."""
    return integer(value, name, minimum=0)


def positive_ints(**sizes: object) -> None:
    """Check several sizes at once: `positive_ints(batch=batch, seq=seq)`."""
    for name, value in sizes.items():
        positive_int(value, name)


def number(
    value: object,
    name: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    strict: bool = False,
) -> float:
    """`value` as a finite float in [minimum, maximum] ((minimum, maximum] with `strict`).

    Bools, strings, NaN and infinities are refused.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x!r}")
    if minimum is not None and (x <= minimum if strict else x < minimum):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {minimum:g}, got {x!r}")
    if maximum is not None and x > maximum:
        raise ValueError(f"{name} must be <= {maximum:g}, got {x!r}")
    return x


def positive(value: object, name: str) -> float:
    """`value` as a finite float > 0."""
    return number(value, name, minimum=0.0, strict=True)


def nonnegative(value: object, name: str) -> float:
    """`value` as a finite float >= 0."""
    return number(value, name, minimum=0.0)


def fraction(value: object, name: str) -> float:
    """`value` as a float in (0, 1], such as an MFU or a utilization."""
    return number(value, name, minimum=0.0, maximum=1.0, strict=True)


def int_sequence(values: object, name: str, *, minimum: int | None = 0) -> tuple[int, ...]:
    """`values` (a list or tuple of integers, not a string) as a tuple of ints, each >=
    `minimum`."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of integers such as (2, 3), got {values!r}")
    return tuple(integer(v, f"{name}[{i}]", minimum=minimum) for i, v in enumerate(values))


def choice(value: T, name: str, choices: Iterable[Any]) -> T:
    """`value` itself if it is one of `choices`; ValueError listing them otherwise."""
    options = list(choices)
    try:
        ok = value in options
    except TypeError:  # unhashable or incomparable: certainly not an option
        ok = False
    if not ok:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(map(repr, options))}")
    return value


def attributes(obj: object, name: str, attrs: Iterable[str], *, example: str) -> None:
    """`obj` must have every attribute in `attrs` (duck-typed configs); TypeError naming the
    first missing."""
    for attr in attrs:
        if not hasattr(obj, attr):
            raise TypeError(f"{name} needs a {attr!r} attribute ({example}), "
                            f"got {type(obj).__name__}")
