"""Headless Chromium renders the SVG flame graph, and a person's hover, click and search work."""

from __future__ import annotations

import base64
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

import pytest

from qmpprof.output.flamegraph import SCRIPT
from tests.consumers.cdp import Browser
from tests.consumers.conftest import Outputs, dump_dom
from tests.consumers.samples import HOSTILE, MARKER_ATTRIBUTE, MARKER_SCRIPT

SVG = "{http://www.w3.org/2000/svg}"


def frames(root: ET.Element) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if "frame" in g.get("class", "").split()]


def test_search_from_the_url_highlights_matches(chromium: str, outputs: Outputs) -> None:
    dom, _ = dump_dom(chromium, f"{outputs.svg.as_uri()}#s=_leaf", 3000)
    root = ET.fromstring(dom)
    matched = sorted(g.get("data-n", "") for g in frames(root) if "match" in g.get("class", ""))
    assert matched == ["checksum_leaf", "physics_leaf"]
    assert root.findtext(f".//{SVG}text[@id='matched']") == "Matched: 62.5% (2 frames)"
    assert root.findtext(f".//{SVG}text[@id='search']") == "Reset search"


def test_guest_strings_never_run(chromium: str, outputs: Outputs) -> None:
    dom, _ = dump_dom(chromium, outputs.svg.as_uri(), 3000)
    root = ET.fromstring(dom)
    assert "data-pwned" not in root.attrib
    scripts = list(root.iter(f"{SVG}script"))
    assert len(scripts) == 1 and scripts[0].text == SCRIPT
    names = {g.get("data-n") for g in frames(root)}
    assert {f"{HOSTILE} (66)", f"{MARKER_SCRIPT} (67)", MARKER_ATTRIBUTE} <= names


@pytest.fixture
def browser(chromium: str, outputs: Outputs) -> Iterator[Browser]:
    browser = Browser(chromium, 1200, 300)
    try:
        browser.open(outputs.svg.as_uri())
        yield browser
    finally:
        browser.close()


#: The heaviest frame of a name (`_start` is in four processes).
FIND = (
    "[...document.querySelectorAll('#frames > .frame')].filter(g => g.dataset.n === %r)"
    ".sort((a, b) => b.dataset.w - a.dataset.w)[0]"
)


def box(browser: Browser, name: str) -> dict[str, Any]:
    """Where the frame `name` is drawn, and its label and classes."""
    script = f"""(() => {{
        const g = {FIND % name};
        const r = g.querySelector('rect').getBoundingClientRect();
        const t = g.querySelector('text');
        return {{x: r.x, y: r.y, width: r.width, height: r.height, label: t.textContent,
                 textWidth: t.getComputedTextLength(), classes: g.getAttribute('class')}};
    }})()"""
    result: dict[str, Any] = browser.evaluate(script)
    return result


def text(browser: Browser, element_id: str) -> str:
    value: str = browser.evaluate(f"document.getElementById({element_id!r}).textContent")
    return value


def centre(frame: dict[str, Any]) -> tuple[float, float]:
    return frame["x"] + frame["width"] / 2, frame["y"] + frame["height"] / 2


def test_frames_are_drawn_with_their_labels(browser: Browser) -> None:
    physics = box(browser, "physics_leaf")
    assert physics["width"] == pytest.approx(1180 * 40 / 104, abs=0.5)
    assert physics["label"] == "physics_leaf" and physics["textWidth"] > 20
    assert box(browser, "all")["width"] == pytest.approx(1180, abs=0.5)
    assert (
        browser.dialogs == []
        and browser.evaluate("document.querySelectorAll('script').length") == 1
    )


def test_hover_shows_name_module_samples_and_share(browser: Browser) -> None:
    browser.mouse("mouseMoved", *centre(box(browser, "crunch_loop")))
    assert text(browser, "details") == "crunch_loop (crunch.elf, user) — 15 samples, 14.42%"
    browser.mouse("mouseMoved", 5, 5)
    assert text(browser, "details") == " "


def test_click_zooms_and_reset_restores(browser: Browser) -> None:
    browser.click(*centre(box(browser, "crunch_loop")))
    zoomed = box(browser, "crunch_loop")
    assert zoomed["width"] == pytest.approx(1180, abs=0.5) and zoomed["label"] == "crunch_loop"
    assert "hide" in box(browser, "physics_leaf")["classes"]
    assert "parent" in box(browser, "_start")["classes"]
    assert "hide" not in browser.evaluate("document.getElementById('unzoom').getAttribute('class')")
    unzoom = browser.evaluate(
        "(() => { const r = document.getElementById('unzoom').getBBox(); "
        "return [r.x + r.width / 2, r.y + r.height / 2]; })()"
    )
    browser.click(*unzoom)
    assert box(browser, "crunch_loop")["width"] == pytest.approx(1180 * 15 / 104, abs=0.5)
    assert "hide" not in box(browser, "physics_leaf")["classes"]


def test_ctrl_f_prompts_and_highlights(browser: Browser) -> None:
    browser.answer = lambda message: "checksum"
    browser.key("f", "KeyF", 70, modifiers=2)
    assert browser.dialogs == [("prompt", "Search frames (regular expression):")]
    assert text(browser, "matched") == "Matched: 24.0% (3 frames)"
    assert "match" in box(browser, "sys_checksum")["classes"]
    assert (
        browser.evaluate(f"getComputedStyle({FIND % 'sys_checksum'}.querySelector('rect')).fill")
        == "rgb(230, 0, 230)"
    )
    browser.key("Escape", "Escape", 27)
    assert text(browser, "matched") == "" and "match" not in box(browser, "sys_checksum")["classes"]


def test_search_button_takes_a_regular_expression(browser: Browser) -> None:
    browser.answer = lambda message: "^(kernel|_start)"
    search = browser.evaluate(
        "(() => { const r = document.getElementById('search').getBBox(); "
        "return [r.x + r.width / 2, r.y + r.height / 2]; })()"
    )
    browser.click(*search)
    assert text(browser, "matched") == "Matched: 97.1% (8 frames)"
    assert text(browser, "search") == "Reset search"
    png = base64.b64decode(browser.send("Page.captureScreenshot")["data"])
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
