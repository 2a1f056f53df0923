"""Models used across the book.

`config.py` holds `TransformerConfig` and its named presets; it is pure Python, so napkin math on a
2.7B-parameter model needs no torch. `transformer.py` builds the model itself (imports torch).
This package file imports nothing, so `import mlsys.models.config` stays torch-free.
"""
