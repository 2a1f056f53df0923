"""Where am I running, and how big should the experiments be?

`profile()` decides the sizes every chapter uses:

| profile | chosen when                                 | sizes                          |
|---------|---------------------------------------------|--------------------------------|
| smoke   | `MLSYS_PROFILE=smoke` (CI, `make test`)     | tiny, seconds per chapter      |
| cpu     | no GPU (laptop, CI machine without smoke)   | small but meaningful, minutes  |
| gpu     | a CUDA device is present                    | the real sizes                 |

`MLSYS_PROFILE` always wins; otherwise the hardware decides (never the `CI` variable).

Triton's interpreter (`TRITON_INTERPRET=1`) must be switched on before any `@triton.jit` function
is defined, so kernel modules call `setup_triton()` first; it does so when no GPU is present.
Nothing here runs at import time. Used in: every chapter (the first cell prints `describe()`).
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import os
import platform
import sys
from importlib.metadata import version
from typing import TypeVar

import torch

PROFILES = ("smoke", "cpu", "gpu")
PROFILE_VARIABLE = "MLSYS_PROFILE"

T = TypeVar("T")


def device() -> str:
    """The best available torch device type: "cuda", "mps" or "cpu"."""
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def profile() -> str:
    """The execution profile: `MLSYS_PROFILE` if set, else "gpu" with CUDA and "cpu" without."""
    requested = os.environ.get(PROFILE_VARIABLE, "").strip().lower()
    if requested:
        if requested not in PROFILES:
            raise ValueError(
                f"{PROFILE_VARIABLE}={requested!r} is not a known profile; "
                f"choose one of {', '.join(PROFILES)}"
            )
        return requested
    return "gpu" if device() == "cuda" else "cpu"


def pick(*, smoke: T, cpu: T, gpu: T, profile_name: str | None = None) -> T:
    """Choose a value by profile: `pick(smoke=64, cpu=512, gpu=4096)`.

    `profile_name` overrides the detected profile (useful in tests).
    """
    name = profile() if profile_name is None else profile_name
    if name not in PROFILES:
        raise ValueError(f"profile_name={name!r} is not a known profile; "
                         f"choose one of {', '.join(PROFILES)}")
    return {"smoke": smoke, "cpu": cpu, "gpu": gpu}[name]


PROGRESS_VARIABLE = "MLSYS_PROGRESS"


def progress_enabled() -> bool:
    """Show progress bars? `MLSYS_PROGRESS` if set (1/true/on/yes or not), else: on a terminal."""
    requested = os.environ.get(PROGRESS_VARIABLE)
    if requested is not None:
        return requested.strip().lower() in TRUE_SPELLINGS
    return sys.stderr.isatty()


def has_triton() -> bool:
    """Is the `triton` package installed? (It is Linux-only; macOS and Windows readers lack it.)"""
    return importlib.util.find_spec("triton") is not None


TRUE_SPELLINGS = ("1", "true", "on", "yes", "y")
"""Values of a boolean environment variable that Triton reads as true (case-insensitive), as its
`getenv_bool` does; anything else is false."""


def triton_interpreted() -> bool:
    """Will Triton kernels run in the CPU interpreter (`TRITON_INTERPRET` set to 1, true, on,
    yes)?"""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in TRUE_SPELLINGS


def setup_triton() -> bool:
    """Prepare Triton for this machine; returns whether Triton can be used at all.

    With no CUDA device, kernels can only run in Triton's interpreter, which reads
    `TRITON_INTERPRET=1` when each `@triton.jit` function is *defined*. The kernel modules call this
    before defining theirs (importing `triton` itself earlier, as `torch.utils.flop_counter` does,
    is harmless). An explicit `TRITON_INTERPRET` set by the user is left alone. Where kernels will
    be interpreted, `fix_triton_interpreter` mends Triton 3.6's interpreter for NumPy 2.4.
    """
    if not has_triton():
        return False
    if device() != "cuda" and "TRITON_INTERPRET" not in os.environ:
        os.environ["TRITON_INTERPRET"] = "1"
    if triton_interpreted():
        fix_triton_interpreter()
    return True


def fix_triton_interpreter() -> bool:
    """Make Triton < 3.7's interpreter turn a scalar into an index as Triton 3.7's does; returns
    whether it patched (False on Triton 3.7 and later, or when already done).

    Triton 3.6's interpreter converts a scalar (`tl.minimum(n, m)`, `tl.cdiv(...)`) used as a
    `range`/`tl.range` bound with `int(data)`, data a NumPy array of shape (1,); NumPy 2.4 refuses
    that ("only 0-dimensional arrays can be converted to Python scalars"), so flash attention's
    and RMSNorm's backward kernels fail on a CPU. Triton 3.7 squeezes the array first; so does the
    `__index__` installed here, after the interpreter's own, for each interpreted launch only.
    """
    major_minor = tuple(int(p) for p in version("triton").split(".")[:2] if p.isdigit())
    if major_minor >= (3, 7):
        return False
    from triton.runtime import interpreter  # Triton may be absent: only when it will interpret

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "squeezes_scalars", False):
        return False

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patch_lang_tensor.squeezes_scalars = True
    interpreter._patch_lang_tensor = patch_lang_tensor
    return True


def versions() -> dict[str, str]:
    """Versions of Python, torch, Triton and (on GPU) CUDA, as strings ("absent" when missing)."""
    out = {"python": platform.python_version(), "torch": torch.__version__}
    out["triton"] = version("triton") if has_triton() else "absent"
    out["cuda"] = torch.version.cuda or "none"
    return out


def device_name() -> str:
    """Human name of the device experiments run on, e.g. "NVIDIA H100 80GB HBM3" or
    "CPU (x86_64, 2 cores)"."""
    kind = device()
    if kind == "cuda":
        return torch.cuda.get_device_name()
    if kind == "mps":
        return f"Apple MPS ({platform.machine()})"
    return f"CPU ({platform.machine()}, {os.cpu_count()} cores)"


def cuda_capability() -> str:
    """Compute capability of the current CUDA device, e.g. "9.0" (ValueError without one)."""
    if not torch.cuda.is_available():
        raise ValueError("no CUDA device: torch.cuda.is_available() is False")
    return ".".join(map(str, torch.cuda.get_device_capability()))


def describe() -> str:
    """The stamp printed at the top of each chapter, two lines short enough for the page: the
    device and profile, then the versions and the date."""
    v = versions()
    triton = v["triton"] + (" interpreter" if triton_interpreted() else "")
    today = _dt.date.today().isoformat()
    return (
        f"device: {device_name()} | profile: {profile()}\n"
        f"torch {v['torch']} | triton {triton} | python {v['python']} | {today}"
    )
