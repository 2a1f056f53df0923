"""Napkin math as pure functions: ints, dtype names and configs in; numbers or small dataclasses out.

Nothing here imports torch, touches a device or prints, so every formula can be used in a chapter's
prediction cell, a one-pager table and a unit test that compares it with a real counter.
"""
