"""Consistency of the book's configuration with the repository, and the page helpers."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mlsys import book

ROOT = Path(__file__).resolve().parents[1]
MAX_COLUMNS = 100
PAGES = sorted((ROOT / "book").glob("*.md"))


def _code_cells(page: Path) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of each executed MyST code cell (```{code-cell}) of `page`.

    Plain fences (```python, ```bash) only show code and are left out.
    """
    cells, current, start = [], None, 0
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        if current is None and line.startswith("```{code-cell}"):
            current, start = [], number + 1
        elif current is not None and line.startswith("```"):
            cells.append((start, current))
            current = None
        elif current is not None:
            current.append(line)
    return cells


def _toc_files():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc["parts"]:
        files += [entry["file"] for entry in part["chapters"]]
    return files


def test_every_toc_entry_exists_and_every_chapter_is_listed():
    files = _toc_files()
    for entry in files:
        assert any((ROOT / f"{entry}{ext}").exists() for ext in (".md", ".py", ".ipynb")), entry
    sources = (ROOT / "notebooks").glob("[0-9][0-9]_*.py")
    chapters = sorted(p.with_suffix("").relative_to(ROOT).as_posix() for p in sources)
    assert chapters, "no chapters found"
    assert set(chapters) <= set(files), set(chapters) - set(files)


def test_chapter_install_cell_points_at_the_configured_repository():
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    for chapter in (ROOT / "notebooks").glob("[0-9][0-9]_*.py"):
        text = chapter.read_text()
        assert f"git+{url}" in text, f"{chapter.name} installs from another URL than {url}"


def test_chapters_follow_the_skeleton():
    for chapter in (ROOT / "notebooks").glob("[0-9][0-9]_*.py"):
        text = chapter.read_text()
        assert re.search(r'^# %% tags=\["parameters"', text, re.MULTILINE), \
            f"{chapter.name} has no parameters cell (it may also be hidden: \"hide-input\")"
        for marker in ("env.describe()", "{admonition} Takeaway", "## Exercises", "## Summary"):
            assert marker in text, f"{chapter.name} lacks {marker!r}"


MAX_CHAPTER_CODE_LINES = 260
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))


def _code_lines(chapter: Path) -> int:
    """Non-blank lines in the chapter's code cells, hidden and removed ones included."""
    import jupytext  # the book's tool: only these tests read chapters as notebooks

    cells = jupytext.read(chapter).cells
    return sum(1 for c in cells if c.cell_type == "code"
               for line in c.source.splitlines() if line.strip())


def test_every_chapter_keeps_its_code_short():
    """At most `MAX_CHAPTER_CODE_LINES` lines of code per chapter (DESIGN: about 250): what grows
    beyond moves into the library as a named function the chapter calls. Prose, figures and
    exercises are not capped."""
    code = {chapter.name: _code_lines(chapter) for chapter in CHAPTERS}
    assert {name: n for name, n in code.items() if n > MAX_CHAPTER_CODE_LINES} == {}
    assert len(code) >= 10


EXERCISE_KINDS = ("multi-step", "find the error", "code")
MIN_EXERCISES = 4


def _exercises(chapter: Path) -> list[str]:
    """The `### Q<n> ...` headings between a chapter's `## Exercises` and `## Summary`."""
    text = chapter.read_text()
    if "# ## Exercises" not in text:
        return []
    section = text.split("# ## Exercises", 1)[1].split("# ## Summary", 1)[0]
    return re.findall(r"^# ### (Q\d+ .*)$", section, flags=re.MULTILINE)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_chapter_has_exercises_that_make_the_reader_work(chapter):
    """At least four problems, among them one of each kind, marked in the heading:
    `### Q3 (multi-step) ...` (three or more dependent steps), `### Q4 (find the error) ...` and
    `### Q5 (code) ...`, a cell the reader completes, checked through `book.solved_by` whichever
    of the reader's and the book's solution is there."""
    titles = _exercises(chapter)
    assert len(titles) >= MIN_EXERCISES, titles
    kinds = {kind for title in titles for kind in EXERCISE_KINDS
             if re.match(rf"Q\d+ \({kind}\)", title)}
    assert kinds == set(EXERCISE_KINDS), f"missing kinds: {set(EXERCISE_KINDS) - kinds}"
    assert "solved_by(" in chapter.read_text(), "the coding exercise is not checked by solved_by"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_chapter_draws_a_diagram_from_the_library(chapter):
    """A conceptual diagram drawn by `mlsys.diagrams` from the code that computes it."""
    assert re.search(r"from mlsys(\.diagrams)? import .*\bdiagrams\b|from mlsys\.diagrams import",
                     chapter.read_text()), f"{chapter.name} draws no diagram of mlsys.diagrams"


def test_glue_returns_its_value_and_checks_the_name():
    assert book.glue("some_value", 42) == 42
    with pytest.raises(ValueError, match="identifier"):
        book.glue("not a name", 1)


def test_solved_by_runs_the_readers_code_once_written_and_the_books_before():
    def unwritten(x):
        raise NotImplementedError("your code here")

    def written(x):
        return x + 1

    def wrong(x):
        raise IndexError("off by one")

    assert book.solved_by(unwritten, lambda x: 2 * x, 5) == (10, "the book's")
    assert book.solved_by(written, lambda x: 2 * x, 5) == (6, "yours")
    with pytest.raises(IndexError, match="off by one"):
        book.solved_by(wrong, written, 5)
    with pytest.raises(TypeError, match="must both be functions"):
        book.solved_by(written, None, 5)


def test_table_renders_html_and_text_and_checks_widths():
    table = book.Table(["a", "b"], [[1, "<x>"], [22, 3.5]])
    html = table._repr_html_()
    assert html.count("<tr>") == 3 and "&lt;x&gt;" in html
    assert repr(table).splitlines()[1].startswith("1   <x>")
    with pytest.raises(ValueError, match="row 0 has 1 cells for 2 columns"):
        book.Table(["a", "b"], [[1]])


def test_num_formats_significant_digits_without_exponents_in_the_middle():
    assert book.num(0.012345) == "0.0123"
    assert book.num(4.5678) == "4.57"
    assert book.num(123.4) == "123"
    assert book.num(123456.7) == "123,457"
    assert book.num(3.4e38, 6) == "3.4e+38"
    assert book.num(65504.0, 6) == "65504"
    with pytest.raises(ValueError, match="digits"):
        book.num(1.0, 0)


def test_num_refuses_what_is_not_a_number():
    for bad in ("abc", "1.5", True, None, [1.0]):
        with pytest.raises(TypeError, match=r"x must be a real number, got .* \("):
            book.num(bad)
    with pytest.raises(TypeError, match="digits must be an integer"):
        book.num(1.0, 2.5)
    assert (book.num(7), book.num(float("inf")), book.num(float("nan"))) == ("7", "inf", "nan")


def test_code_cells_are_found_where_pages_execute_code():
    assert _code_cells(ROOT / "book" / "hardware.md"), "the code-cell parser found nothing"
    assert not _code_cells(ROOT / "book" / "bibliography.md")


def test_no_page_defines_its_own_helpers():
    """Tables, formatters and cost models come from `mlsys` (`book.markdown_table`, `book.num`,
    `accounting`); a page's executed cells define no function. Code a page only shows belongs in
    a plain fence (```python), which is not executed."""
    found = []
    for page in PAGES:
        for start, lines in _code_cells(page):
            for offset, line in enumerate(lines):
                if re.match(r"\s*(async\s+)?def \w|\s*class \w", line):
                    found.append(f"{page.name}:{start + offset}: {line.strip()}")
    listed = "\n".join(found)
    assert not found, f"pages define helpers (use mlsys.book / mlsys.accounting):\n{listed}"


def test_glue_works_in_a_plain_script():
    """Chapters run as scripts (no notebook kernel, tests/kernels/test_triton.py): glue must neither
    fail nor print there."""
    code = "from mlsys.book import glue; assert glue('x', 1.5) == 1.5; assert glue('y', 'z') == 'z'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""


def _long_lines() -> list[str]:
    sources = [*(ROOT / "notebooks").glob("*.py"), *(ROOT / "lib").rglob("*.py")]
    found = []
    for path in sorted(sources):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if len(line) > MAX_COLUMNS:
                found.append(f"{path.relative_to(ROOT)}:{number} ({len(line)})")
    for page in PAGES:
        for start, lines in _code_cells(page):
            for offset, line in enumerate(lines):
                if len(line) > MAX_COLUMNS:
                    found.append(f"{page.relative_to(ROOT)}:{start + offset} ({len(line)})")
    return found


def test_no_code_line_is_longer_than_100_columns():
    found = _long_lines()
    assert not found, f"{len(found)} lines over {MAX_COLUMNS} columns:\n" + "\n".join(found)
