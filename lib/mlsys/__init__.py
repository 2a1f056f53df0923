"""mlsys: the library behind the executable course book on the systems side of training large
models.

Modules are imported explicitly (`from mlsys import env, hardware`); importing the package does
nothing else. `accounting` and `hardware` need no torch, so napkin math runs anywhere.
"""

__version__ = "0.1.0"
