"""Open the built book in real headless Chromium and check what a reader would see.

Run by `make test` after the smoke build (`MLSYS_BOOK_HTML` points at the HTML folder). For the
index and every page in `_toc.yml`: the title is there, every image loaded (naturalWidth > 0),
notebook pages show at least as many figures as their executed notebook produced, no cell shows an
error or traceback, math is present where the source has math, and no JavaScript error beyond the
two known harmless ones. A full-page screenshot of each page goes to `_build/screenshots/`.

What a reader sees is measured by `page_survey` (run it as a script for the table of every page):
at 1280 px no code block, output, table, figure or display equation is cut at the column's edge;
at a 390-px phone width no paragraph, list, heading, admonition or figure is; every chapter shows
at least `MIN_FIGURES` figures and at most `MAX_CODE_SHARE` of its column in visible code; every
one-pager prints on at most `MAX_ONEPAGER_A4` A4 pages.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml
from page_survey import PHONE_BLOCKS, a4_pages, survey

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
HTML = Path(os.environ.get("MLSYS_BOOK_HTML", ROOT / "_build" / "html")).resolve()
SCREENSHOTS = ROOT / "_build" / "screenshots"
# Logged by every page of a stock Jupyter Book 1 build (see shared/notes/jupyter-book.md).
HARMLESS_JS_ERRORS = ("Identifier 'THEBE_JS_URL' has already been declared",
                      "Got invalid theme mode")
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MIN_FIGURES = 4
MAX_CODE_SHARE = 0.15
"""Of a chapter's column, the share that code a reader sees may take (hidden cells excluded)."""
MAX_ONEPAGER_A4 = 2
PHONE = {"width": 390, "height": 844}
MATH_IN_SOURCE = re.compile(r"\$[^$\n]+\$|\$\$|\{math\}")


def _chromium() -> str | None:
    candidate = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    return candidate if Path(candidate).exists() else None


def _pages() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]]
    for part in toc["parts"]:
        pages += [entry["file"] for entry in part["chapters"]]
    return pages


def _source(page: str) -> Path:
    for ext in (".md", ".py", ".ipynb"):
        if (ROOT / f"{page}{ext}").exists():
            return ROOT / f"{page}{ext}"
    raise FileNotFoundError(page)


def _figures_in_executed_notebook(page: str) -> int:
    """How many image outputs the build's executed copy of a notebook page has (0 for plain
    pages)."""
    executed = HTML.parent / "jupyter_execute" / f"{page}.ipynb"
    if not executed.exists():
        return 0
    nb = json.loads(executed.read_text())
    tags_removing_output = {"remove-output", "remove-cell"}
    return sum(
        1
        for cell in nb["cells"]
        if cell["cell_type"] == "code"
        and not tags_removing_output & set(cell.get("metadata", {}).get("tags", []))
        for out in cell.get("outputs", [])
        if "image/png" in out.get("data", {}) or "image/svg+xml" in out.get("data", {})
    )


@pytest.fixture(scope="module")
def browser():
    chromium = _chromium()
    if chromium is None:
        pytest.skip("Chromium not found (install Debian's `chromium` or set $CHROMIUM)")
    if not (HTML / "index.html").exists():
        pytest.fail(f"no built book at {HTML}: run `make book-smoke` (or `make test`) first")
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


def _open(browser, url: str, viewport: dict | None = None):
    page = browser.new_page(viewport=viewport or {"width": 1280, "height": 900})
    js_errors: list[str] = []
    page.on("pageerror", lambda err: js_errors.append(str(err)))
    page.on("console", lambda msg: js_errors.append(msg.text) if msg.type == "error" else None)
    page.goto(url, wait_until="load")
    return page, js_errors


def test_index_redirects_to_the_first_page(browser):
    page, _ = _open(browser, (HTML / "index.html").as_uri())
    page.wait_for_url(re.compile(r".*/book/intro\.html$"), timeout=10_000)
    assert page.title()
    page.close()


@pytest.mark.parametrize("name", _pages())
def test_page_renders_cleanly(browser, name):
    html = HTML / f"{name}.html"
    assert html.exists(), f"{name}.html was not built"
    page, js_errors = _open(browser, html.as_uri())
    try:
        assert page.title().strip(), "empty <title>"
        assert page.locator("main h1").count() >= 1, "no page heading"

        images = page.evaluate(
            "() => Array.from(document.querySelectorAll('main img'))"
            ".map(i => [i.src, i.complete, i.naturalWidth])"
        )
        broken = [src for src, complete, width in images if not complete or width == 0]
        assert not broken, f"images that did not load: {broken}"
        expected_figures = _figures_in_executed_notebook(name)
        shown = page.locator("main .cell_output img").count()
        assert shown >= expected_figures, (
            f"{shown} figures shown, the notebook produced {expected_figures}")

        text = page.locator("main").inner_text()
        assert "Traceback (most recent call last)" not in text
        assert page.locator("main .traceback, main .output.error").count() == 0
        stderr = page.locator("main .output.stderr").all_inner_texts()
        assert not [s for s in stderr if "Error" in s], stderr

        if MATH_IN_SOURCE.search(_source(name).read_text()):
            math = page.locator("main .math, main mjx-container").count()
            assert math > 0, "source has math, page has none"

        unexpected = [e for e in js_errors if not any(h in e for h in HARMLESS_JS_ERRORS)]
        assert not unexpected, unexpected

        seen = survey(page)
        assert not seen["cut"], f"{len(seen['cut'])} blocks cut at 1280 px: {seen['cut'][:5]}"
        if name.startswith("notebooks/"):
            assert seen["figures"] >= MIN_FIGURES, f"{seen['figures']} figures shown"
            assert seen["code_share"] <= MAX_CODE_SHARE, f"code is {seen['code_share']:.0%}"
        page.screenshot(path=str(SCREENSHOTS / f"{name.replace('/', '__')}.png"), full_page=True)
    finally:
        page.close()


def test_page_contents_are_one_click_away_at_1280(browser):
    """Below 1500 px the "On this page" column gives its width to the text (`_static/mlsys.css`);
    the list button at the top right must still open the page's contents."""
    page, _ = _open(browser, (HTML / "notebooks" / "04_bytes.html").as_uri())
    try:
        assert not page.locator("div.bd-sidebar-secondary").is_visible()
        toggles = [b for b in page.locator("button.secondary-toggle").all() if b.is_visible()]
        assert toggles, "no visible button opens the page's contents"
        toggles[0].click()
        drawer = page.locator("dialog#pst-secondary-sidebar-modal")
        drawer.wait_for(state="visible", timeout=5_000)
        assert drawer.locator("a").count() >= 3, "the drawer lists no sections"
    finally:
        page.close()


@pytest.mark.parametrize("name", _pages())
def test_prose_and_figures_fit_a_phone(browser, name):
    page, _ = _open(browser, (HTML / f"{name}.html").as_uri(), viewport=PHONE)
    try:
        cut = survey(page, PHONE_BLOCKS)["cut"]
        assert not cut, f"{len(cut)} blocks cut at {PHONE['width']} px: {cut[:5]}"
    finally:
        page.close()


@pytest.mark.parametrize("name", [p for p in _pages() if p.endswith("_onepager")])
def test_one_pager_prints_on_two_a4_pages(browser, name):
    page, _ = _open(browser, (HTML / f"{name}.html").as_uri())
    try:
        pages = a4_pages(page)
        assert 1 <= pages <= MAX_ONEPAGER_A4, f"{name} prints on {pages} A4 pages"
    finally:
        page.close()
