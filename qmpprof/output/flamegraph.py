"""An interactive flame graph (`.svg`) in one self-contained file, in the manner of flamegraph.pl.

The stacks are merged into a tree whose root is "all", then the process, then its thread (or
the vCPU, `--group-by`), then the stack from its outermost frame to its leaf (the root at the
bottom). Kernel frames are warm (red to orange), user frames cool (green to teal); frames
without a symbol are paler.
Hovering a frame shows its name, module, samples and share; clicking zooms into it; "Search"
(or Ctrl-F, or `#s=REGEX` in the URL) highlights the matching frames and shows how much of
the profile they cover. Everything is inline: no fonts, scripts or styles are fetched.

Every string from the guest is XML-escaped, and the script reads them only as data (from
attributes, written back with textContent), so no guest string can become markup or code.
"""

from __future__ import annotations

import colorsys
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from importlib import resources
from pathlib import Path
from xml.sax.saxutils import escape

from qmpprof.model import Recording, Sample
from qmpprof.profile import Grouping, Scope, counted, group_labels

WIDTH = 1200
PAD = 10
FRAME_HEIGHT = 16
FONT_SIZE = 12
CHAR_WIDTH = 0.59 * FONT_SIZE
HEADER = 66
FOOTER = 34

#: What makes the SVG interactive: static files shipped with the package (no guest string
#: is ever put in them), inlined into every graph between newlines.
_ASSETS = resources.files("qmpprof.output") / "assets"
STYLE = "\n" + (_ASSETS / "flamegraph.css").read_text(encoding="utf-8")
SCRIPT = "\n" + (_ASSETS / "flamegraph.js").read_text(encoding="utf-8")

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_ATTRIBUTE_ENTITIES = {'"': "&quot;", "'": "&apos;", "\n": "&#10;", "\r": "&#13;", "\t": "&#9;"}


def write_flamegraph(
    samples: Sequence[Sample],
    recording: Recording,
    path: Path,
    scope: Scope = Scope.ALL,
    include_idle: bool = False,
    grouping: Grouping = Grouping.THREAD,
) -> None:
    """Write the counted samples to `path` as an interactive SVG flame graph (replacing it)."""
    root = build_tree(samples, scope, include_idle, grouping)
    title = graph_title(recording, root.count, len(samples), scope, include_idle)
    path.write_text(render_svg(root, title), encoding="utf-8")


class Kind(Enum):
    """What a frame of the flame graph stands for, which decides its colour."""

    ROOT = "root"
    PROCESS = "process"
    #: A level between the process and the stack: a thread or a vCPU.
    GROUP = "group"
    KERNEL = "kernel"
    USER = "user"


_STACK = (Kind.KERNEL, Kind.USER)


@dataclass
class Node:
    """One frame of the merged tree: what it is, how many samples pass through it, callees."""

    name: str
    kind: Kind
    module: str | None = None
    count: int = 0
    children: dict[tuple[str, str, str | None], Node] = field(default_factory=dict)

    def child(self, name: str, kind: Kind, module: str | None = None) -> Node:
        """The child with this identity, created if new."""
        key = (name, kind.value, module)
        if key not in self.children:
            self.children[key] = Node(name, kind, module)
        return self.children[key]

    @property
    def known(self) -> bool:
        """False for a stack frame no symbol covered (its name is the raw address)."""
        return self.module is not None or self.kind not in _STACK


def build_tree(
    samples: Sequence[Sample],
    scope: Scope,
    include_idle: bool,
    grouping: Grouping = Grouping.THREAD,
) -> Node:
    """Merge the counted samples: all → process → thread or vCPU → frames, outermost first."""
    root = Node("all", Kind.ROOT)
    for sample in samples:
        frames = counted(sample, scope, include_idle)
        if not frames:
            continue
        node = root
        node.count += 1
        for depth, label in enumerate(group_labels(sample, grouping)):
            node = node.child(label, Kind.GROUP if depth else Kind.PROCESS)
            node.count += 1
        for frame in reversed(frames):
            kind = Kind.KERNEL if frame.is_kernel else Kind.USER
            node = node.child(frame.label(), kind, frame.module)
            node.count += 1
    return root


def graph_title(
    recording: Recording, shown: int, total: int, scope: Scope, include_idle: bool
) -> str:
    """The recording's parameters in one line: kernel, duration, rate, samples, filters."""
    kernel = recording.kernel_title()
    rate = 1 / recording.period_s if recording.period_s else 0.0
    idle = "idle included" if include_idle else "idle excluded"
    return (
        f"{kernel}: {recording.duration_s:.1f} s at {rate:.0f} Hz, {shown} of {total} samples "
        f"shown (scope {scope.value}, {idle})"
    )


# --- layout ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Box:
    """A node placed in the graph: its first sample's offset and its depth (root = 0)."""

    node: Node
    offset: int
    depth: int


def layout(root: Node) -> Iterator[Box]:
    """Every node with its place: children side by side in name order, as flamegraph.pl."""
    stack = [Box(root, 0, 0)]
    while stack:
        box = stack.pop()
        yield box
        offset = box.offset
        for child in sorted(box.node.children.values(), key=_order):
            stack.append(Box(child, offset, box.depth + 1))
            offset += child.count


def _order(node: Node) -> tuple[str, str, str]:
    return node.name, node.kind.value, node.module or ""


# --- SVG -----------------------------------------------------------------------------------


def xml_text(text: str) -> str:
    """`text` safe as XML character data (characters XML cannot hold become U+FFFD)."""
    return escape(_NOT_XML.sub("\ufffd", text))


def xml_attr(text: str) -> str:
    """`text` safe inside a double- or single-quoted XML attribute, whitespace kept."""
    return escape(_NOT_XML.sub("\ufffd", text), _ATTRIBUTE_ENTITIES)


def render_svg(root: Node, title: str) -> str:
    """The whole SVG document."""
    boxes = list(layout(root)) if root.count else []
    height = HEADER + (1 + max((box.depth for box in boxes), default=0)) * FRAME_HEIGHT + FOOTER
    frames = "\n".join(_frame(box, root.count, height) for box in boxes)
    return (
        '<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n'
        f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" data-total="{root.count}" '
        f'data-width="{WIDTH - 2 * PAD}" data-pad="{PAD}" data-char="{CHAR_WIDTH:.2f}">\n'
        f"<style>{STYLE}</style>\n"
        f'<script type="text/ecmascript"><![CDATA[{SCRIPT}]]></script>\n'
        f"{_header(title, height)}\n"
        f'<g id="frames">\n{frames}\n</g>\n</svg>\n'
    )


def _header(title: str, height: int) -> str:
    return "\n".join(
        [
            f'<rect class="background" width="{WIDTH}" height="{height}"/>',
            f'<text id="title" x="{WIDTH // 2}" y="24">qmpprof flame graph</text>',
            f'<text id="subtitle" x="{WIDTH // 2}" y="42">{xml_text(title)}</text>',
            _legend(),
            f'<text id="unzoom" class="button hide" x="{PAD}" y="24">Reset zoom</text>',
            f'<text id="search" class="button" x="{WIDTH - PAD}" y="24">Search</text>',
            f'<text id="matched" x="{WIDTH - PAD}" y="{height - 12}"></text>',
            f'<text id="details" x="{PAD}" y="{height - 12}"> </text>',
        ]
    )


def _legend() -> str:
    entries = [
        ("kernel", _colour("kernel", Kind.KERNEL, True)),
        ("user", _colour("user", Kind.USER, True)),
        ("no symbol (kernel, user)", _colour("kernel", Kind.KERNEL, False)),
        ("process", _colour("", Kind.PROCESS, True)),
        ("thread or vCPU", _colour("", Kind.GROUP, True)),
        ("search match", "rgb(230,0,230)"),
    ]
    parts, x = [], PAD
    for label, fill in entries:
        parts.append(f'<rect x="{x}" y="50" width="10" height="10" fill="{fill}"/>')
        parts.append(f'<text class="legend" x="{x + 14}" y="59">{label}</text>')
        x += 24 + int(len(label) * 6.2)
    return "\n".join(parts)


def _frame(box: Box, total: int, height: int) -> str:
    node, scale = box.node, (WIDTH - 2 * PAD) / total
    x, width = PAD + box.offset * scale, node.count * scale
    y = height - FOOTER - (box.depth + 1) * FRAME_HEIGHT
    return (
        f'<g class="frame" data-x="{box.offset}" data-w="{node.count}" data-d="{box.depth}" '
        f'data-n="{xml_attr(node.name)}">'
        f"<title>{xml_text(describe(node, total))}</title>"
        f'<rect x="{x:.2f}" y="{y}" width="{width:.2f}" height="{FRAME_HEIGHT - 1}" '
        f'rx="2" ry="2" fill="{_colour(node.name, node.kind, node.known)}"/>'
        f'<text x="{x + 3:.2f}" y="{y + FRAME_HEIGHT - 4}">'
        f"{xml_text(fit_label(node.name, width))}</text></g>"
    )


def describe(node: Node, total: int) -> str:
    """What hovering a frame shows: name, module and mode, samples and share of all."""
    share = f"{node.count} sample{'s' if node.count != 1 else ''}, {100 * node.count / total:.2f}%"
    if node.kind in _STACK:
        module = node.module if node.module is not None else "no symbol"
        return f"{node.name} ({module}, {node.kind.value}) — {share}"
    prefix = "process " if node.kind is Kind.PROCESS else ""
    return f"{prefix}{node.name} — {share}"


def fit_label(name: str, width: float) -> str:
    """`name` cut to what fits in a frame `width` pixels wide ('' when not even 3 characters)."""
    chars = int((width - 6) / CHAR_WIDTH)
    if chars < 3:
        return ""
    return name if len(name) <= chars else name[: chars - 2] + ".."


def _colour(name: str, kind: Kind, known: bool) -> str:
    """A stable colour per name: warm for kernel frames, cool for user frames."""
    jitter = (zlib.crc32(name.encode("utf-8", "replace")) & 0xFFFF) / 0xFFFF
    hue, saturation, lightness = {
        Kind.KERNEL: (0 + 38 * jitter, 0.80, 0.58),
        Kind.USER: (95 + 75 * jitter, 0.55, 0.50),
        Kind.PROCESS: (270, 0.35, 0.76),
        Kind.GROUP: (210, 0.40, 0.78),
        Kind.ROOT: (0, 0.0, 0.80),
    }[kind]
    if not known:
        saturation, lightness = saturation * 0.45, 0.74
    red, green, blue = colorsys.hls_to_rgb(hue / 360, lightness, saturation)
    return f"rgb({round(red * 255)},{round(green * 255)},{round(blue * 255)})"
