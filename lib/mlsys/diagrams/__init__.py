"""Conceptual diagrams: each drawn from the code that computes what it shows.

A diagram is not a picture pasted into a page: the bit fields come from the format's (e, m), a
tiling from the kernel's block sizes, a schedule from the schedule code, a mesh from the mesh
code. Each module draws one chapter's ideas with the house style of `mlsys.plotting`, takes its
numbers as arguments (or from floors 1–3), and returns the figure it drew.
"""
