"""speedscope, SVG flame graph and pprof writers, each checked by an independent parser:
json and the schema's rules, xml.etree, and a protobuf decoder of the tests' own.

tests/consumers feeds the same samples (tests/consumers/samples.py) to the real consumers.
"""

from __future__ import annotations

import colorsys
import gzip
import json
import re
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from qmpprof.model import Frame, Mode, Process, Sample
from qmpprof.output.flamegraph import SCRIPT, write_flamegraph
from qmpprof.output.pprof import write_pprof
from qmpprof.output.speedscope import SCHEMA, write_speedscope
from qmpprof.profile import Grouping, Scope
from tests.consumers.protobuf import Fields, decode_message, ints, messages, one
from tests.consumers.samples import (
    COUNTED,
    HOSTILE,
    IDLE,
    KERNEL_BASE,
    KERNEL_SCOPE,
    MARKER_ATTRIBUTE,
    MARKER_SCRIPT,
    ODD_FRAME,
    PERIOD_S,
    RECORDING,
    TOTAL,
    USER_BASE,
    USER_SCOPE,
    realistic_samples,
)


def test_the_fixture_is_what_the_tests_assume() -> None:
    samples = realistic_samples()
    assert len(samples) == TOTAL == 112
    assert Counter(s.mode for s in samples)[Mode.IDLE] == IDLE
    labels = {s.label() for s in samples}
    assert labels >= {"crunch (1)", "[kernel]", "cr3:0x5000", HOSTILE + " (66)"}


# --- speedscope --------------------------------------------------------------------------


def speedscope(
    tmp_path: Path,
    scope: Scope = Scope.ALL,
    idle: bool = False,
    grouping: Grouping = Grouping.VCPU,
) -> dict[str, Any]:
    path = tmp_path / "out.speedscope.json"
    write_speedscope(realistic_samples(), RECORDING, path, scope, idle, grouping)
    document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    check_speedscope_schema(document)
    return document


def check_speedscope_schema(document: dict[str, Any]) -> None:
    """What file-format-schema.json requires of a file of sampled profiles."""
    assert document["$schema"] == SCHEMA == "https://www.speedscope.app/file-format-schema.json"
    for key, kind in (("name", str), ("exporter", str), ("activeProfileIndex", int)):
        assert isinstance(document.get(key), kind)
    frames = document["shared"]["frames"]
    assert all(set(f) <= {"name", "file", "line", "col"} for f in frames)
    assert all(isinstance(f["name"], str) and isinstance(f.get("file", ""), str) for f in frames)
    for profile in document["profiles"]:
        check_sampled_profile(profile, len(frames))
    assert 0 <= document["activeProfileIndex"] < max(1, len(document["profiles"]))


def check_sampled_profile(profile: dict[str, Any], frame_count: int) -> None:
    assert profile["type"] == "sampled" and isinstance(profile["name"], str)
    assert profile["unit"] in ("none", "nanoseconds", "microseconds", "milliseconds", "seconds")
    assert all(isinstance(profile[key], int | float) for key in ("startValue", "endValue"))
    assert len(profile["samples"]) == len(profile["weights"]) > 0
    for stack in profile["samples"]:
        assert stack and all(isinstance(i, int) and 0 <= i < frame_count for i in stack)
    total = sum(profile["weights"])
    assert profile["endValue"] - profile["startValue"] == pytest.approx(total)


def stacks(document: dict[str, Any], profile_name: str) -> Counter[tuple[str, ...]]:
    """The named profile's stacks as frame names, root first, with counts."""
    names = [f["name"] for f in document["shared"]["frames"]]
    (profile,) = (p for p in document["profiles"] if p["name"] == profile_name)
    return Counter(tuple(names[i] for i in stack) for stack in profile["samples"])


def test_speedscope_has_one_profile_per_vcpu_and_process(tmp_path: Path) -> None:
    document = speedscope(tmp_path)
    assert [p["name"] for p in document["profiles"]] == [
        "vCPU 0 — [kernel]",
        "vCPU 0 — cr3:0x5000",
        "vCPU 1 — crunch (1)",
        f"vCPU 2 — {HOSTILE} (66)",
        "vCPU 2 — cr3:0x7000",
        "vCPU 2 — render (2)",
        f"vCPU 3 — {MARKER_SCRIPT} (67)",
    ]
    assert sum(len(p["samples"]) for p in document["profiles"]) == COUNTED
    assert all(
        p["unit"] == "seconds" and set(p["weights"]) == {PERIOD_S} for p in document["profiles"]
    )
    assert document["exporter"] == "qmpprof" and "kernel.elf" in document["name"]


def test_speedscope_stacks_are_root_first_with_modules(tmp_path: Path) -> None:
    document = speedscope(tmp_path)
    assert stacks(document, "vCPU 1 — crunch (1)") == {
        ("_start", "crunch_checksum", "sys_checksum", "checksum_leaf"): 25,
        ("_start", "crunch_loop"): 15,
    }
    assert stacks(document, "vCPU 2 — render (2)") == {("_start", "main", ODD_FRAME): 10}
    files = {f["name"]: f.get("file") for f in document["shared"]["frames"]}
    assert files["physics_leaf"] == "kernel.elf" and files["crunch_loop"] == "crunch.elf"
    assert files[f"{KERNEL_BASE + 7:#x}"] is None and files[f"{USER_BASE + 7:#x}"] is None


def test_speedscope_scopes_and_idle(tmp_path: Path) -> None:
    def total(document: dict[str, Any]) -> int:
        return sum(len(p["samples"]) for p in document["profiles"])

    assert total(speedscope(tmp_path, Scope.KERNEL)) == KERNEL_SCOPE
    assert total(speedscope(tmp_path, Scope.USER)) == USER_SCOPE
    with_idle = speedscope(tmp_path, idle=True)
    assert total(with_idle) == TOTAL
    assert (
        stacks(with_idle, "vCPU 0 — [kernel]")[
            ("kernel_entry", "kernel_main", "idle_loop", "idle_halt")
        ]
        == 5
    )
    kernel = speedscope(tmp_path, Scope.KERNEL)
    assert stacks(kernel, "vCPU 1 — crunch (1)") == {("sys_checksum", "checksum_leaf"): 25}


# --- SVG flame graph -----------------------------------------------------------------------

SVG = "{http://www.w3.org/2000/svg}"


@dataclass(frozen=True)
class SvgFrame:
    """One frame of the flame graph as the SVG shows it."""

    name: str
    samples: int
    offset: int
    depth: int
    title: str
    fill: str
    text: str
    width: float


def flamegraph(
    tmp_path: Path,
    scope: Scope = Scope.ALL,
    idle: bool = False,
    grouping: Grouping = Grouping.VCPU,
) -> ET.Element:
    path = tmp_path / "out.svg"
    write_flamegraph(realistic_samples(), RECORDING, path, scope, idle, grouping)
    return ET.fromstring(path.read_bytes())


def svg_frames(root: ET.Element) -> Iterator[SvgFrame]:
    for g in root.iter(f"{SVG}g"):
        if g.get("class") == "frame":
            rect, text, title = g.find(f"{SVG}rect"), g.find(f"{SVG}text"), g.find(f"{SVG}title")
            assert rect is not None and text is not None and title is not None
            yield SvgFrame(
                g.attrib["data-n"],
                int(g.attrib["data-w"]),
                int(g.attrib["data-x"]),
                int(g.attrib["data-d"]),
                title.text or "",
                rect.attrib["fill"],
                text.text or "",
                float(rect.attrib["width"]),
            )


def by_depth(root: ET.Element, depth: int) -> Counter[str]:
    """Samples per frame name at one depth (summed over the processes and vCPUs)."""
    counts: Counter[str] = Counter()
    for frame in svg_frames(root):
        if frame.depth == depth:
            counts[frame.name] += frame.samples
    return counts


def test_svg_is_all_then_process_then_vcpu_then_stack(tmp_path: Path) -> None:
    root = flamegraph(tmp_path)
    assert by_depth(root, 0) == {"all": COUNTED}
    processes = by_depth(root, 1)
    assert processes["crunch (1)"] == 40 and processes["[kernel]"] == 40
    assert processes[HOSTILE + " (66)"] == 4 and sum(processes.values()) == COUNTED
    assert by_depth(root, 2) == {"vCPU 0": 45, "vCPU 1": 40, "vCPU 2": 17, "vCPU 3": 2}
    assert by_depth(root, 3)["kernel_entry"] == 45 and by_depth(root, 3)["_start"] == 56
    assert by_depth(root, 5)["sys_checksum"] == 25 and by_depth(root, 6)["checksum_leaf"] == 25


def test_svg_by_default_has_a_process_whole_with_threads_below_it(tmp_path: Path) -> None:
    """perf's and samply's grouping: a process is not split by the vCPUs it ran on; a
    thread level appears where the OS tells threads apart (none in these samples)."""
    root = flamegraph(tmp_path, grouping=Grouping.THREAD)
    assert by_depth(root, 1)["crunch (1)"] == 40
    assert by_depth(root, 2)["kernel_entry"] == 45 and by_depth(root, 2)["_start"] == 56
    sample = realistic_samples()[0]
    threads = [
        replace(sample, vcpu=v, process=Process(90, "pinned", t))
        for v, t in ((0, 90), (1, 91), (0, 91))
    ]
    path = tmp_path / "threads.svg"
    write_flamegraph(threads, RECORDING, path)
    threaded = ET.fromstring(path.read_bytes())
    assert by_depth(threaded, 1) == {"pinned (90)": 3}
    assert by_depth(threaded, 2) == {"thread 90": 1, "thread 91": 2}
    path = tmp_path / "process.svg"
    write_flamegraph(threads, RECORDING, path, grouping=Grouping.PROCESS)
    assert by_depth(ET.fromstring(path.read_bytes()), 2) == {"kernel_entry": 3}


def test_svg_children_nest_inside_their_parents(tmp_path: Path) -> None:
    frames = list(svg_frames(flamegraph(tmp_path)))
    for frame in frames:
        if frame.depth:
            parents = [
                p
                for p in frames
                if p.depth == frame.depth - 1
                and p.offset <= frame.offset
                and frame.offset + frame.samples <= p.offset + p.samples
            ]
            assert len(parents) == 1, frame


def test_svg_hovers_show_name_module_samples_and_share(tmp_path: Path) -> None:
    frames = list(svg_frames(flamegraph(tmp_path)))
    titles = {f.name: f.title for f in frames}
    assert titles["physics_leaf"] == "physics_leaf (kernel.elf, kernel) — 40 samples, 38.46%"
    assert titles[ODD_FRAME] == f"{ODD_FRAME} (render.elf, user) — 10 samples, 9.62%"
    assert titles[f"{USER_BASE + 7:#x}"].startswith(f"{USER_BASE + 7:#x} (no symbol, user)")
    assert "vCPU 2 — 10 samples, 9.62%" in {f.title for f in frames}  # grouped by vCPU
    assert titles["crunch (1)"] == "process crunch (1) — 40 samples, 38.46%"


def hue(fill: str) -> float:
    red, green, blue = (int(v) / 255 for v in re.findall(r"\d+", fill))
    return 360 * colorsys.rgb_to_hls(red, green, blue)[0]


def test_svg_kernel_frames_are_warm_and_user_frames_cool(tmp_path: Path) -> None:
    frames = list(svg_frames(flamegraph(tmp_path)))
    kernel = [f for f in frames if ", kernel)" in f.title]
    user = [f for f in frames if ", user)" in f.title]
    assert len(kernel) > 5 and len(user) > 5
    assert all(hue(f.fill) <= 40 for f in kernel)
    assert all(90 <= hue(f.fill) <= 175 for f in user)


def test_svg_labels_fit_their_frames(tmp_path: Path) -> None:
    for frame in svg_frames(flamegraph(tmp_path)):
        assert len(frame.text) * 0.59 * 12 <= frame.width
        assert frame.text == "" or frame.name.startswith(frame.text.removesuffix(".."))


def test_svg_title_has_the_recording_parameters(tmp_path: Path) -> None:
    subtitle = flamegraph(tmp_path).find(f".//{SVG}text[@id='subtitle']")
    assert subtitle is not None
    assert subtitle.text == (
        f"kernel.elf: 1.1 s at 100 Hz, {COUNTED} of {TOTAL} samples shown "
        "(scope all, idle excluded)"
    )


def test_svg_guest_strings_stay_text(tmp_path: Path) -> None:
    root = flamegraph(tmp_path)
    scripts = list(root.iter(f"{SVG}script"))
    assert len(scripts) == 1 and scripts[0].text == SCRIPT
    assert len(list(root.iter("script"))) == 0
    names = {f.name for f in svg_frames(root)}
    assert {HOSTILE + " (66)", MARKER_SCRIPT + " (67)", MARKER_ATTRIBUTE, ODD_FRAME} <= names
    for element in root.iter():
        assert not any(name.lower().startswith("on") for name in element.attrib), element.attrib
        assert "pwned" not in "".join(element.attrib)


def test_svg_is_self_contained(tmp_path: Path) -> None:
    flamegraph(tmp_path)
    content = (tmp_path / "out.svg").read_text(encoding="utf-8")
    assert "href" not in content and "@import" not in content and "url(" not in content


def test_svg_scope_and_idle(tmp_path: Path) -> None:
    assert by_depth(flamegraph(tmp_path, Scope.KERNEL), 0) == {"all": KERNEL_SCOPE}
    assert by_depth(flamegraph(tmp_path, Scope.USER), 0) == {"all": USER_SCOPE}
    with_idle = list(svg_frames(flamegraph(tmp_path, idle=True)))
    assert {f.name: f.samples for f in with_idle if f.depth == 0} == {"all": TOTAL}
    assert sum(f.samples for f in with_idle if f.name == "idle_halt") == IDLE
    assert "idle_halt" not in {f.name for f in svg_frames(flamegraph(tmp_path))}


def test_svg_control_characters_from_the_guest_are_replaced(tmp_path: Path) -> None:
    sample = realistic_samples()[0]
    odd = Sample(0.0, 0, Mode.KERNEL, sample.frames, sample.stop, 0, Process(9, "a\x00b\x1bc"))
    path = tmp_path / "odd.svg"
    write_flamegraph([odd], RECORDING, path)
    names = {f.name for f in svg_frames(ET.fromstring(path.read_bytes()))}
    assert "a\ufffdb\ufffdc (9)" in names


# --- pprof: a protobuf decoder written from the wire format, independent of the encoder ---


@dataclass
class Pprof:
    """The parts of a decoded profile.proto the tests look at."""

    strings: list[str]
    top: Fields
    functions: dict[int, tuple[str, str, str]]
    locations: dict[int, tuple[int, int, list[int]]]
    mappings: dict[int, tuple[int, int, str, int]]
    samples: list[tuple[list[str], list[int], dict[str, str | int]]]


def read_pprof(path: Path, scope: Scope = Scope.ALL, idle: bool = False) -> Pprof:
    return read_pprof_of(realistic_samples(), path, scope, idle)


def read_pprof_of(
    samples: list[Sample], path: Path, scope: Scope = Scope.ALL, idle: bool = False
) -> Pprof:
    """Write `samples` as pprof and decode the file again."""
    write_pprof(samples, RECORDING, path, scope, idle)
    raw = path.read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    top = decode_message(gzip.decompress(raw))
    strings = [s.decode("utf-8") for s in top[6] if isinstance(s, bytes)]
    profile = Pprof(strings, top, {}, {}, {}, [])
    for f in messages(top, 5):
        profile.functions[one(f, 1)] = (strings[one(f, 2)], strings[one(f, 3)], strings[one(f, 4)])
    for loc in messages(top, 4):
        lines = [one(line, 1) for line in messages(loc, 4)]
        profile.locations[one(loc, 1)] = (one(loc, 2), one(loc, 3), lines)
    for m in messages(top, 3):
        profile.mappings[one(m, 1)] = (one(m, 2), one(m, 3), strings[one(m, 5)], one(m, 7))
    profile.samples = [_pprof_sample(profile, s) for s in messages(top, 2)]
    return profile


def _pprof_sample(
    profile: Pprof, sample: Fields
) -> tuple[list[str], list[int], dict[str, str | int]]:
    names = []
    for location_id in ints(sample, 1):
        (function_id,) = profile.locations[location_id][2]
        names.append(profile.functions[function_id][0])
    labels: dict[str, str | int] = {}
    for label in messages(sample, 3):
        key = profile.strings[one(label, 1)]
        has_string = one(label, 2) != 0
        labels[key] = profile.strings[one(label, 2)] if has_string else one(label, 3)
        if not has_string:
            assert profile.strings[one(label, 4)] == "vcpu"  # else pprof drops vCPU 0
    return names, ints(sample, 2), labels


def test_pprof_header(tmp_path: Path) -> None:
    profile = read_pprof(tmp_path / "p.pb.gz")
    strings = profile.strings
    assert strings[0] == ""
    types = [(strings[one(t, 1)], strings[one(t, 2)]) for t in messages(profile.top, 1)]
    assert types == [("samples", "count"), ("cpu", "nanoseconds")]
    (period_type,) = messages(profile.top, 11)
    assert (strings[one(period_type, 1)], strings[one(period_type, 2)]) == ("cpu", "nanoseconds")
    assert one(profile.top, 12) == 10_000_000
    assert one(profile.top, 9) == 1_700_000_000 * 10**9
    assert one(profile.top, 10) == 1_100_000_000
    assert [strings[i] for i in ints(profile.top, 13)] == [RECORDING.command_line]


def test_pprof_samples_are_leaf_first_with_values_and_labels(tmp_path: Path) -> None:
    profile = read_pprof(tmp_path / "p.pb.gz")
    counts: Counter[tuple[str, ...]] = Counter()
    for names, values, _ in profile.samples:
        assert values == [values[0], values[0] * 10_000_000]
        counts[tuple(names)] += values[0]
    assert counts.total() == COUNTED
    assert counts[("checksum_leaf", "sys_checksum", "crunch_checksum", "_start")] == 25
    assert counts[("physics_leaf", "physics_step", "kernel_main", "kernel_entry")] == 40
    label_sets = {tuple(sorted(labels.items())) for _, _, labels in profile.samples}
    assert (("mode", "kernel"), ("process", "[kernel]"), ("vcpu", 0)) in label_sets
    assert (("mode", "user"), ("process", HOSTILE + " (66)"), ("vcpu", 2)) in label_sets


def test_pprof_functions_locations_and_mappings(tmp_path: Path) -> None:
    profile = read_pprof(tmp_path / "p.pb.gz")
    functions = list(profile.functions.values())
    assert len(functions) == len(set(functions))
    assert ("physics_leaf", "physics_leaf", "kernel.elf") in functions
    assert (ODD_FRAME, ODD_FRAME, "render.elf") in functions
    assert ("main", "main", "render.elf") in functions and (
        "_start",
        "_start",
        "m.elf",
    ) in functions
    mappings = {name: (start, limit, has) for start, limit, name, has in profile.mappings.values()}
    assert set(mappings) == {"kernel.elf", "crunch.elf", "render.elf", "evil.elf", "m.elf"}
    assert all(has == 1 for _, _, has in mappings.values())
    addresses: dict[int, list[int]] = {}
    for mapping_id, address, _ in profile.locations.values():
        addresses.setdefault(mapping_id, []).append(address)
    for mapping_id, (start, limit, _, _) in profile.mappings.items():
        assert (start, limit) == (min(addresses[mapping_id]), max(addresses[mapping_id]) + 1)
    assert mappings["kernel.elf"][0] > KERNEL_BASE > mappings["m.elf"][1]
    unknown = {address for mapping_id, address, _ in profile.locations.values() if not mapping_id}
    assert unknown == {KERNEL_BASE + 7, USER_BASE + 7}


def test_pprof_same_address_in_two_binaries_is_two_locations(tmp_path: Path) -> None:
    profile = read_pprof(tmp_path / "p.pb.gz")
    starts = [
        (address, profile.functions[lines[0]][2])
        for _, address, lines in profile.locations.values()
        if profile.functions[lines[0]][0] == "_start"
    ]
    assert len({address for address, _ in starts}) == 1
    assert sorted(module for _, module in starts) == [
        "crunch.elf",
        "evil.elf",
        "m.elf",
        "render.elf",
    ]


def test_pprof_scope_and_idle(tmp_path: Path) -> None:
    def total(profile: Pprof) -> int:
        return sum(values[0] for _, values, _ in profile.samples)

    assert total(read_pprof(tmp_path / "k.pb.gz", Scope.KERNEL)) == KERNEL_SCOPE
    assert total(read_pprof(tmp_path / "u.pb.gz", Scope.USER)) == USER_SCOPE
    with_idle = read_pprof(tmp_path / "i.pb.gz", idle=True)
    assert total(with_idle) == TOTAL
    modes = Counter(
        labels["mode"] for _, values, labels in with_idle.samples for _ in range(values[0])
    )
    assert modes["idle"] == IDLE


# --- all formats ----------------------------------------------------------------------------


def test_nothing_to_count_still_writes_valid_files(tmp_path: Path) -> None:
    idle_only = [s for s in realistic_samples() if s.mode is Mode.IDLE]
    write_speedscope(idle_only, RECORDING, tmp_path / "e.speedscope.json")
    document = json.loads((tmp_path / "e.speedscope.json").read_text(encoding="utf-8"))
    check_speedscope_schema(document)
    assert document["profiles"] == []
    write_flamegraph(idle_only, RECORDING, tmp_path / "e.svg")
    root = ET.fromstring((tmp_path / "e.svg").read_bytes())
    assert list(svg_frames(root)) == []
    assert read_pprof_of(idle_only, tmp_path / "e.pb.gz").samples == []


def test_guest_strings_that_are_not_text_do_not_break_a_format(tmp_path: Path) -> None:
    sample = realistic_samples()[0]
    bad = Sample(0.0, 0, Mode.KERNEL, sample.frames, sample.stop, 0, Process(9, "x\udc80y"))
    write_speedscope([bad], RECORDING, tmp_path / "b.speedscope.json")
    document = json.loads((tmp_path / "b.speedscope.json").read_text(encoding="utf-8"))
    assert document["profiles"][0]["name"] == "x\udc80y (9)"
    write_flamegraph([bad], RECORDING, tmp_path / "b.svg")
    names = {f.name for f in svg_frames(ET.fromstring((tmp_path / "b.svg").read_bytes()))}
    assert "x\ufffdy (9)" in names
    labels = read_pprof_of([bad], tmp_path / "b.pb.gz").samples[0][2]
    assert labels["process"] == "x?y (9)"


def test_svg_a_symbol_named_like_an_address_sits_beside_the_unknown_frame(tmp_path: Path) -> None:
    unknown = realistic_samples()[4]  # unknown_kernel: an address no symbol covers
    (leaf, *outer) = unknown.frames
    named = Frame(leaf.address, leaf.label(), 0, "kernel.elf")  # a guest can name it so
    same_name = Sample(0.0, 0, Mode.KERNEL, (named, *outer), unknown.stop, 0x5000, None)
    write_flamegraph([unknown, same_name], RECORDING, tmp_path / "same.svg")
    frames = list(svg_frames(ET.fromstring((tmp_path / "same.svg").read_bytes())))
    assert [f.samples for f in frames if f.name == leaf.label()] == [1, 1]


def test_speedscope_has_one_profile_per_thread_of_a_process(tmp_path: Path) -> None:
    """Two threads of `pinned (90)` on one vCPU: the main thread's profile is named after
    the process, the other's after its thread id too."""
    sample = realistic_samples()[0]
    threads = [replace(sample, vcpu=4, process=Process(90, "pinned", tid)) for tid in (90, 91, 91)]
    path = tmp_path / "threads.speedscope.json"
    write_speedscope(threads, RECORDING, path)
    document = json.loads(path.read_text())
    check_speedscope_schema(document)
    profiles = {p["name"]: len(p["samples"]) for p in document["profiles"]}
    assert profiles == {"pinned (90)": 1, "pinned (90), thread 91": 2}
    write_speedscope(threads, RECORDING, path, grouping=Grouping.VCPU)
    by_vcpu = {p["name"]: len(p["samples"]) for p in json.loads(path.read_text())["profiles"]}
    assert by_vcpu == {"vCPU 4 — pinned (90)": 1, "vCPU 4 — pinned (90), thread 91": 2}
