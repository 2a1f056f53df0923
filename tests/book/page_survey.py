"""What a reader sees on a built page, measured in Chromium: used by `test_browser.py`, and run
as a script to print the survey of every page (`python tests/book/page_survey.py [HTML folder]`).

Per page: its height, the share of the content column taken by code a reader sees (inputs not
folded behind a toggle), the figures shown, the exercises, and the blocks cut at the column's
right edge (code, outputs, tables and images that are wider than the column and do not wrap),
folded ones included: a reader who opens a hidden cell must not find it cut either.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Runs in the page. A block is cut when its content is wider than the box it is shown in (it
# scrolls sideways), or when the box itself runs past the right edge of the article column.
WIDE_BLOCKS = 'pre, table, img, mjx-container[display="true"]'
"""Blocks that must fit the column at 1280 px: code, outputs, tables, figures, display math."""
PHONE_BLOCKS = "p, li, h1, h2, h3, figure, img, .admonition"
"""Blocks that must fit a phone's column (390 px): prose and figures (code may scroll there)."""

SURVEY_JS = r"""
(selector) => {
  const article = document.querySelector('main article') || document.querySelector('main');
  const column = article.getBoundingClientRect();
  // Laid out: a block folded in a closed <details> (a hidden cell) still has a box in Chromium,
  // and is checked for cuts, since a reader who opens it sees it. Shown: laid out and not folded.
  const visible = el => el.offsetParent !== null && el.getClientRects().length > 0;
  const shown = el => visible(el) && !el.closest('details:not([open])');
  const cut = [];
  const blocks = article.querySelectorAll(selector);
  for (const el of blocks) {
    if (!visible(el)) continue;
    if (el.tagName !== 'TABLE' && el.parentElement.closest('table')) continue;  // its table counts
    const box = el.getBoundingClientRect();
    const scrolls = el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0;
    const runsOver = box.right > column.right + 1;
    if (scrolls || runsOver) {
      const text = (el.innerText || el.getAttribute('src') || el.tagName).trim();
      cut.push(`${el.tagName.toLowerCase()}.${el.className}`.slice(0, 60) + ': '
               + text.split('\n')[0].slice(0, 70)
               + ` (${Math.round(Math.max(el.scrollWidth, box.width))} px in ${Math.round(
                   Math.min(el.clientWidth || box.width, column.right - box.left))} px)`);
    }
  }
  let code = 0;
  for (const el of article.querySelectorAll('.cell_input')) {
    if (shown(el)) code += el.getBoundingClientRect().height;
  }
  const figures = Array.from(article.querySelectorAll('.cell_output img, figure img'))
    .filter(shown).length;
  const exercises = Array.from(article.querySelectorAll('section'))
    .filter(s => /^exercises/i.test((s.querySelector('h2')||{}).innerText || ''))
    .map(s => s.querySelectorAll('section h3').length).reduce((a, b) => a + b, 0);
  return {height: Math.round(document.documentElement.scrollHeight),
          column_px: Math.round(column.width),
          code_share: column.height > 0 ? code / column.height : 0,
          figures, exercises, cut};
}
"""


def survey(page, blocks: str = WIDE_BLOCKS) -> dict:
    """The survey of one open Playwright page (see `SURVEY_JS`), checking `blocks` for cuts."""
    return page.evaluate(SURVEY_JS, blocks)


A4_MARGIN = "10mm"  # what Chromium's print dialog uses by default


def a4_pages(page) -> int:
    """How many A4 pages an open Playwright page prints to in Chromium (10 mm margins, the
    theme's print style: no sidebars, no header)."""
    pdf = page.pdf(format="A4", margin={side: A4_MARGIN for side in
                                         ("top", "bottom", "left", "right")})
    return len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", pdf))


def main(html: Path) -> None:
    from playwright.sync_api import sync_playwright  # the browser: only the script needs it
    from test_browser import CHROMIUM_FLAGS, _chromium, _pages  # its flags and page list

    print(f"{'page':32} {'height':>7} {'column':>6} {'code':>5} {'figs':>4} {'ex':>3} {'cut':>4} "
          f"{'A4':>3}")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium(), headless=True,
                                     args=CHROMIUM_FLAGS)
        for name in _pages():
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto((html / f"{name}.html").as_uri(), wait_until="load")
            s = survey(page)
            pages = a4_pages(page) if name.endswith("onepager") else ""
            print(f"{name:32} {s['height']:7} {s['column_px']:6} {s['code_share']:5.0%} "
                  f"{s['figures']:4} {s['exercises']:3} {len(s['cut']):4} {pages:>3}")
            for line in s["cut"][: int(os.environ.get("SHOW_CUT", "0"))]:
                print("     ", line)
            page.close()
        browser.close()


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "_build/smoke/_build/html").resolve())
