"""The README and docs/ held to the code: docs/reference.md lists every option of every
command and no option the parser lacks, every `qmpprof` command line the pages show parses,
every relative link points at a file (an image included) and, with an #anchor, at a
heading of it, every page of docs/ is reachable from the README, and the README stays a
few screens long."""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from qmpprof.cli import _with_default_command, build_parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference.md"
MAX_README_LINES = 300

#: Options no section lists: argparse's own, on every command.
UNLISTED = frozenset({"-h", "--help"})
#: (section, flag): a flag a command's section names that its parser lacks, and why.
NOT_IN_PARSER = {
    ("record", "--one-shot"): "an alias of `dump`, rewritten before parsing "
    "(cli._with_default_command), so no parser has it",
    ("report", "--capture-memory"): "report reads what `record --capture-memory` kept",
}

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
LONG_FLAG = re.compile(r"(?<![\w/-])--[a-z][a-z0-9-]*")
COMMAND_HEADING = re.compile(r"^## `qmpprof (\w+)`\s*$")
COMMAND_LINE = re.compile(r"^\s*(?:\$\s+)?(?:sudo\s+)?(?:[A-Z_]+=\S+\s+)*qmpprof\s")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


@cache
def subparsers() -> dict[str, argparse.ArgumentParser]:
    """Each command's parser, by name, as `qmpprof` builds them."""
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("qmpprof's parser has no commands")


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def prose_lines(text: str) -> Iterator[str]:
    """The lines of a page outside its fenced code blocks."""
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield line


def code_lines(text: str) -> Iterator[str]:
    """The lines inside a page's fenced code blocks, continuation lines joined."""
    fenced, pending = False, ""
    for line in text.splitlines():
        if FENCE.match(line):
            fenced, pending = not fenced, ""
        elif fenced:
            pending += line
            if line.endswith("\\"):
                pending = pending[:-1] + " "
            else:
                yield pending
                pending = ""


def reference_sections() -> dict[str, str]:
    """docs/reference.md cut at its `## qmpprof COMMAND` headings: the command's text up
    to the next second-level heading; the text before them and after is under ''."""
    sections: dict[str, str] = {"": ""}
    current = ""
    for line in REFERENCE.read_text().splitlines():
        heading = COMMAND_HEADING.match(line)
        if heading:
            current = heading.group(1)
            sections[current] = ""
        elif line.startswith("## "):
            current = ""
        sections[current] += line + "\n"
    return sections


def without_command_lines(text: str) -> str:
    """A section less the `qmpprof` command lines it shows (of any command: each is
    parsed by test_shown_command_lines_parse)."""
    return "\n".join(line for line in text.splitlines() if not COMMAND_LINE.match(line))


def mentions(text: str, option: str) -> bool:
    return re.search(rf"(?<![\w/-]){re.escape(option)}(?![\w-])", text) is not None


def test_every_command_has_a_section() -> None:
    assert sorted(reference_sections().keys() - {""}) == sorted(subparsers())


@pytest.mark.parametrize("command", sorted(subparsers()))
def test_reference_lists_every_option(command: str) -> None:
    section = reference_sections()[command]
    missing = sorted(
        option
        for option in option_strings(subparsers()[command]) - UNLISTED
        if not mentions(section, option)
    )
    assert not missing, f"docs/reference.md's `qmpprof {command}` does not list {missing}"


@pytest.mark.parametrize("command", sorted(subparsers()))
def test_reference_names_no_option_the_parser_lacks(command: str) -> None:
    known = option_strings(subparsers()[command])
    named = set(LONG_FLAG.findall(without_command_lines(reference_sections()[command])))
    unknown = sorted(flag for flag in named - known if (command, flag) not in NOT_IN_PARSER)
    assert not unknown, f"`qmpprof {command}` has no {unknown} (docs/reference.md says so)"


def test_every_exception_is_needed() -> None:
    """An exception that no section needs any more goes, so the list stays short."""
    for command, flag in NOT_IN_PARSER:
        section = without_command_lines(reference_sections()[command])
        assert mentions(section, flag), f"NOT_IN_PARSER: `{command}` no longer names {flag}"
        assert flag not in option_strings(subparsers()[command]), f"{flag} is in the parser now"


def test_reference_outside_commands_names_real_options() -> None:
    """The introduction, exit status and output formats: each flag is some command's."""
    text = without_command_lines(reference_sections()[""])
    known = set().union(*map(option_strings, subparsers().values()))
    known |= option_strings(build_parser())
    unknown = sorted(set(LONG_FLAG.findall(text)) - known - {"--one-shot"})
    assert not unknown, f"docs/reference.md names {unknown}, which no command has"
    assert mentions(text, "--version"), "docs/reference.md does not say `qmpprof --version`"


def shown_command_lines() -> Iterator[tuple[str, str]]:
    for page in pages():
        for line in code_lines(page.read_text()):
            if COMMAND_LINE.match(line):
                yield str(page.relative_to(ROOT)), line


@pytest.mark.parametrize(("page", "line"), list(shown_command_lines()))
def test_shown_command_lines_parse(page: str, line: str) -> None:
    """A command line a page shows is one qmpprof accepts (an elided `…` aside; a shell
    substitution `$(…)` stands for a number)."""
    if "…" in line or "..." in line:
        pytest.skip("an elided command line")
    words = shlex.split(re.sub(r"\"?\$\([^)]*\)\"?", "1", line), comments=True)
    while words[0] != "qmpprof":
        words.pop(0)
    try:
        build_parser().parse_args(_with_default_command(words[1:]))
    except SystemExit as exit:  # 0: --help or --version, which print and end
        if exit.code != 0:
            pytest.fail(f"{page}: `{line.strip()}` does not parse (exit {exit.code})")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(page.read_text()):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(page: Path) -> Iterator[str]:
    for line in prose_lines(page.read_text()):
        yield from LINK.findall(INLINE_CODE.sub("code", line))


def broken(page: Path, target: str) -> str | None:
    """Why a link from `page` to `target` leads nowhere, or None."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
        return None
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    if not file.is_relative_to(ROOT):
        return "outside the repository"
    if not file.exists():
        return "no such file"
    if anchor and file.suffix == ".md" and anchor not in anchors(file):
        return f"no heading #{anchor} in {file.relative_to(ROOT)}"
    return None


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_lead_somewhere(page: Path) -> None:
    bad = [f"{target}: {why}" for target in links(page) if (why := broken(page, target))]
    assert not bad, f"{page.relative_to(ROOT)}: {bad}"


def test_every_page_is_reachable_from_the_readme() -> None:
    reached, todo = {README.resolve()}, [README.resolve()]
    while todo:
        page = todo.pop()
        for target in links(page):
            path = target.partition("#")[0]
            if not path or re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            file = (page.parent / path).resolve()
            if file.suffix == ".md" and file.exists() and file not in reached:
                reached.add(file)
                todo.append(file)
    orphans = sorted(str(p.relative_to(ROOT)) for p in DOCS.rglob("*.md") if p not in reached)
    assert not orphans, f"no link leads from the README to {orphans}"


def test_readme_is_a_few_screens() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines (at most {MAX_README_LINES})"
