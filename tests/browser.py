"""Debian's Chromium (`/usr/bin/chromium`) driven by Playwright, which never downloads a
browser here. Used by the UI tests and the UI render benchmark."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from playwright.sync_api import Page, sync_playwright

CHROMIUM = "/usr/bin/chromium"
# Without the background-networking flags Chromium's own connections are refused on a
# closed network and slow everything down.
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def chromium_page(width: int = 1500, height: int = 950, **context: object) -> Iterator[Page]:
    """A fresh page (`context`: Playwright's browser context options); the JavaScript
    errors it raised are in `page.errors` (a list)."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height}, **context)
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.errors = errors  # type: ignore[attr-defined]
            yield page
        finally:
            browser.close()
