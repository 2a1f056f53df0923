"""Napkin math as pure functions: ints, dtype names and configs in; numbers or small dataclasses out.

Nothing here imports torch, touches a device or prints, so every formula can be used in a chapter's
prediction cell, a one-pager table and a unit test that compares it with a real counter.
"""


def require_positive_ints(**sizes: object) -> None:
    """Raise ValueError naming the first argument that is not a positive int (bools are refused)."""
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
