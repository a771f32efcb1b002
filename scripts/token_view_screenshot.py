"""
A screenshot of a report's token view (tokens.html) in headless Chromium, with the hover card of one token open: the
image of docs/preference.md. Made again after the main job (scripts/train_tiny.sh) from its report:

    python scripts/token_view_screenshot.py outputs/tiny/report --token tis --output docs/images/token_view.png

Chromium is Debian's package (`apt-get install chromium`, or TWOTOWER_CHROMIUM=its path), driven by Playwright (in
the test extra). The page is opened offline; an error on the page stops the script.
"""

import argparse
import os
import shutil
from pathlib import Path

from playwright.sync_api import sync_playwright

# The first scored cell that reads as the token
CELL_INDEX = """(text) => Array.from(document.querySelectorAll('.token.scored'))
    .findIndex((s) => s.textContent === text)"""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("report_dir", help="a report folder written by the scoring command (holding tokens.html)")
    parser.add_argument("--token", required=True, help="the text of the scored cell to hover (its first occurrence)")
    parser.add_argument("--output", default="docs/images/token_view.png", help="the PNG to write")
    parser.add_argument("--width", type=int, default=1100, help="the window's width in CSS pixels")
    parser.add_argument("--height", type=int, default=900, help="the window's height in CSS pixels")
    return parser.parse_args(argv)


def chromium_path() -> str:
    path = os.environ.get("TWOTOWER_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise SystemExit("error: no Chromium found: apt-get install chromium, or set TWOTOWER_CHROMIUM to its path")
    return path


def screenshot(page_file: Path, token: str, output: Path, width: int, height: int):
    with sync_playwright() as playwright:
        # --no-sandbox: Chromium's sandbox refuses to start as root, which containers often are
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        context = browser.new_context(offline=True, viewport={"width": width, "height": height})
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(page_file.resolve().as_uri())
        index = page.evaluate(CELL_INDEX, token)
        if index < 0:
            raise SystemExit(f"error: no scored cell reads {token!r} in {page_file}; pass --token a shown token")
        cell = page.locator(".token.scored").nth(index)
        cell.scroll_into_view_if_needed()
        cell.hover()
        if not page.locator("#card").is_visible():
            raise SystemExit(f"error: hovering {token!r} opened no card in {page_file}")
        if errors:
            raise SystemExit(f"error: the page of {page_file} failed: {errors[0]}")
        output.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=output)
        browser.close()


def main(argv=None):
    args = parse_args(argv)
    page_file = Path(args.report_dir) / "tokens.html"
    if not page_file.is_file():
        raise SystemExit(f"error: {page_file} not found; pass a report folder of the scoring command")
    screenshot(page_file, args.token, Path(args.output), args.width, args.height)
    print(f"Wrote {args.output}")


if __name__ == "__main__":
    main()
