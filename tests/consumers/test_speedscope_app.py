"""speedscope's own app (the npm package's build) imports the file: profiles, weights, stacks.

The app is loaded the way its command line (`speedscope FILE`) does it: a script that calls
`speedscope.loadFileFromBase64(name, base64)`, named by `#localProfilePath=` in the URL.
"""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser
from pathlib import Path

from tests.consumers.conftest import Outputs, dump_dom
from tests.consumers.samples import HOSTILE, MARKER_SCRIPT


class Tables(HTMLParser):
    """Every table's rows as lists of cell texts, and the page's title and attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.title = ""
        self.attributes: list[tuple[str, str | None]] = []
        self._in: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in.append(tag)
        self.attributes += attrs
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag == "td" and self.tables and self.tables[-1]:
            self.tables[-1][-1].append("")

    def handle_endtag(self, tag: str) -> None:
        while self._in and self._in.pop() != tag:
            pass

    def handle_data(self, data: str) -> None:
        if "title" in self._in:
            self.title += data
        elif "td" in self._in and self.tables and self.tables[-1] and self.tables[-1][-1]:
            self.tables[-1][-1][-1] += data


def load(chromium: str, app: Path, profile: Path, tmp_path: Path) -> tuple[Tables, str]:
    """The app's page after importing `profile` (sandwich view), and its console log."""
    encoded = base64.b64encode(profile.read_bytes()).decode()
    loader = tmp_path / "load.js"
    loader.write_text(f"speedscope.loadFileFromBase64({json.dumps(profile.name)}, {encoded!r})")
    url = f"{app.as_uri()}#localProfilePath={loader}&view=sandwich"
    dom, log = dump_dom(
        chromium, url, 10_000, "--enable-unsafe-swiftshader", "--enable-logging=stderr", "--v=0"
    )
    page = Tables()
    page.feed(dom)
    return page, log


def test_speedscope_imports_every_profile(
    chromium: str, speedscope_app: Path, outputs: Outputs, tmp_path: Path
) -> None:
    page, log = load(chromium, speedscope_app, outputs.speedscope, tmp_path)
    assert "Importing as speedscope json file" in log
    assert "Something went wrong" not in str(page.tables)
    assert page.title == "qmpprof: kernel.elf, 1.1 s at 100 Hz - speedscope"
    profiles = {row[1]: row[2] for row in page.tables[0] if len(row) == 3}
    assert profiles == {
        "vCPU 0 — [kernel]": "400.00ms",
        "vCPU 0 — cr3:0x5000": "50.00ms",
        "vCPU 1 — crunch (1)": "400.00ms",
        f"vCPU 2 — {HOSTILE} (66)": "40.00ms",
        "vCPU 2 — cr3:0x7000": "30.00ms",
        "vCPU 2 — render (2)": "100.00ms",
        f"vCPU 3 — {MARKER_SCRIPT} (67)": "20.00ms",
    }
    assert not any(name == "data-pwned" for name, _ in page.attributes)


def sandwich(page: Tables) -> dict[str, tuple[str, str]]:
    """Function → (total, self) in the sandwich view of the active profile (the last table)."""
    return {row[2]: (row[0], row[1]) for row in page.tables[-1] if len(row) == 3}


def test_stacks_are_read_root_first(
    chromium: str, speedscope_app: Path, outputs: Outputs, tmp_path: Path
) -> None:
    document = json.loads(outputs.speedscope.read_text(encoding="utf-8"))
    names = [p["name"] for p in document["profiles"]]
    document["activeProfileIndex"] = names.index("vCPU 1 — crunch (1)")
    crunch = tmp_path / "crunch.speedscope.json"
    crunch.write_text(json.dumps(document), encoding="utf-8")
    functions = sandwich(load(chromium, speedscope_app, crunch, tmp_path)[0])
    assert functions["checksum_leaf"] == ("250.00ms (62%)", "250.00ms (62%)")
    assert functions["crunch_loop"] == ("150.00ms (37%)", "150.00ms (37%)")
    assert functions["sys_checksum"] == ("250.00ms (62%)", "0.00ns (<0.01%)")
    assert functions["_start"] == ("400.00ms (100%)", "0.00ns (<0.01%)")
