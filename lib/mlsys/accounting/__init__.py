"""Napkin math as pure functions: ints, dtype names and configs in; numbers or small dataclasses
out.

Nothing here imports torch, touches a device or prints, so every formula can be used in a chapter's
prediction cell, a one-pager table and a unit test that compares it with a real counter. One
concept per module: `params`, `flops`, `bytes`, `memory`, `napkin` (a whole model traced through
all of them). Argument checks come from `mlsys.checks`; this file only re-exports the entry points.
"""

from mlsys.accounting.flops import transformer_flops
from mlsys.accounting.memory import model_state_bytes
from mlsys.accounting.napkin import napkin
from mlsys.accounting.params import count_params

__all__ = ["count_params", "model_state_bytes", "napkin", "transformer_flops"]
