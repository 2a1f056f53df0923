"""Root pytest hooks: generate the .ipynb that nbmake executes from the py:percent chapters.

nbmake only collects `*.ipynb`; the committed sources are `notebooks/*.py`. Conversion runs once,
in the controller process (not in xdist workers), and only for `--nbmake` runs.
"""

from pathlib import Path

NOTEBOOK_DIR = Path(__file__).parent / "notebooks"


def pytest_configure(config):
    if not config.getoption("--nbmake", default=False) or hasattr(config, "workerinput"):
        return
    import jupytext

    for source in sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.py")):
        target = source.with_suffix(".ipynb")
        notebook = jupytext.read(source, fmt="py:percent")
        jupytext.write(notebook, target, fmt="ipynb")
