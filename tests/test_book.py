"""Consistency of the book's configuration with the repository."""

from pathlib import Path

import pytest
import yaml

from mlsys import book

ROOT = Path(__file__).resolve().parents[1]


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
        assert f"git+{url}" in chapter.read_text(), f"{chapter.name} installs from another URL than {url}"


def test_chapters_follow_the_skeleton():
    for chapter in (ROOT / "notebooks").glob("[0-9][0-9]_*.py"):
        text = chapter.read_text()
        for marker in ('tags=["parameters"]', "env.describe()", "{admonition} Takeaway", "## Exercises", "## Summary"):
            assert marker in text, f"{chapter.name} lacks {marker!r}"


def test_glue_returns_its_value_and_checks_the_name():
    assert book.glue("some_value", 42) == 42
    with pytest.raises(ValueError, match="identifier"):
        book.glue("not a name", 1)


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
