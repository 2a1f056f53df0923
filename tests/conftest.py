"""Test-session settings: the smoke profile and a non-interactive matplotlib backend."""

import os

os.environ.setdefault("MLSYS_PROFILE", "smoke")
os.environ.setdefault("MPLBACKEND", "Agg")
