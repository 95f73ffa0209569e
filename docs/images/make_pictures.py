"""Regenerate the README's pictures from a real run of the Linux demo guest (`make pictures`).

Boots the guest of `GUEST=linux make demo` as examples/demo.sh does (examples/linux/boot.sh
through tests/linux_vm.py: Debian's kernel, KASLR on, 2 vCPUs, the workloads crunch,
sysloop, pinned and dynwork), then, with no kernel file and no sysroot (only the
example's own programs given with --user, as the demo gives them):

- records it for 10 s to a flame graph, which headless Chromium renders to
  `flamegraph.png` (1200 px wide, the whole graph);
- keeps what `qmpprof record` printed (the summary on stdout after stderr's lines), in
  colour (FORCE_COLOR=1), and converts it to `summary.svg` with rich;
- runs `qmpprof top` in a 120x40 tmux pane until its table has a few seconds of samples,
  captures the pane with its escapes and converts it to `top.svg` the same way.

Every picture is today's output: nothing is drawn by hand. Run from anywhere with the
project's virtualenv (`.venv/bin/python docs/images/make_pictures.py [--out DIR]`).
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.text import Text

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.consumers.cdp import CHROMIUM_FLAGS
from tests.linux_vm import BOOT, BUILD, ROOT, LinuxGuest, running_linux

IMAGES = ROOT / "docs" / "images"
WORKLOADS = "crunch,sysloop,pinned,dynwork"
#: The guest's QMP socket (tests/linux_vm.py's name), in the working directory qmpprof
#: runs in: the pictures say `./qmp.sock`, not a temporary directory's name.
SOCKET = "qmp.sock"
DURATION_S = 10
#: The terminal the summary is printed to and `top` runs in (columns, rows).
COLUMNS, ROWS = 120, 40
#: `top` is captured once its hottest function has this many samples of its own.
TOP_SAMPLES = 300


def log(line: str) -> None:
    print(f"make_pictures: {line}", file=sys.stderr, flush=True)


def user_programs(guest: LinuxGuest) -> list[str]:
    """The --user arguments of examples/demo.sh: the workloads' programs (built per
    release where dynamically linked), crunch's build without frame pointers too."""
    flavour = guest.sysroot.parent
    args: list[str] = []
    for source in sorted((ROOT / "examples" / "linux" / "workloads").glob("*.c")):
        name = source.stem
        program = flavour / name if os.access(flavour / name, os.X_OK) else BUILD / name
        if program.is_file() and os.access(program, os.X_OK):
            args += ["--user", str(program)]
        if name == "crunch":
            args += ["--user", str(BUILD / "crunchnofp")]
    return args


def boot_args() -> list[str]:
    """examples/demo.sh's arguments to boot.sh: 2 vCPUs, the demo's workloads and, where
    boot.sh has it, --demo (the demo's own initramfs, no debug files fetched)."""
    args = ["--smp", "2", "--workloads", WORKLOADS]
    return [*args, "--demo"] if "--demo)" in BOOT.read_text() else args


def qmpprof(*args: str) -> list[str]:
    return [sys.executable, "-m", "qmpprof", *args]


def record(users: list[str], svg: Path) -> str:
    """Record the guest for DURATION_S to the flame graph `svg` (run beside it, where the
    guest's socket is: the output names `./qmp` and `flamegraph.svg`); what qmpprof
    printed, as a terminal shows it (stderr's lines, then the summary on stdout), colours
    and all (FORCE_COLOR). TTY_INTERACTIVE=0 keeps rich's progress bar, which a terminal
    would show and then erase, out of it."""
    env = {**os.environ, "FORCE_COLOR": "1", "TTY_INTERACTIVE": "0", "COLUMNS": str(COLUMNS)}
    env.pop("NO_COLOR", None)
    command = qmpprof("record", "--qmp-socket", f"./{SOCKET}", *users)
    command += ["--duration", str(DURATION_S), "-o", svg.name]
    result = subprocess.run(
        command,
        cwd=svg.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        check=False,
    )
    printed = result.stdout.decode()
    if result.returncode != 0:
        raise SystemExit(f"qmpprof record failed ({result.returncode}):\n{printed}")
    return printed


class Tmux:
    """A tmux server of our own (its own socket, started with our environment less what
    would change the picture: NO_COLOR, a COLUMNS or LINES that rich would take over the
    pane's size, the TMUX of a session this runs in): the user's sessions and other tmux
    servers are never touched."""

    def __init__(self) -> None:
        self.socket = f"qmpprof-pictures-{os.getpid()}"
        self.session = "top"
        unwanted = ("NO_COLOR", "COLUMNS", "LINES", "TMUX", "TMUX_PANE")
        self.env = {key: value for key, value in os.environ.items() if key not in unwanted}

    def __call__(self, *args: str) -> str:
        command = ["tmux", "-L", self.socket, *args]
        result = subprocess.run(command, env=self.env, capture_output=True, text=True, check=False)
        return result.stdout

    def screen(self) -> str:
        """The pane as it is drawn, with its colours (SGR escapes)."""
        return self("capture-pane", "-e", "-p", "-t", self.session)

    def wait_for(self, condition: Callable[[str], bool], limit_s: float) -> str:
        """Poll the pane until `condition` holds of its text (escapes removed)."""
        started = time.monotonic()
        while time.monotonic() - started < limit_s:
            screen = self.screen()
            if condition(plain(screen)):
                return screen
            time.sleep(0.1)  # a screen reader's polling interval, not a synchronisation
        raise SystemExit(f"the pane never matched within {limit_s} s:\n{plain(self.screen())}")

    def kill(self) -> None:
        self("kill-server")


def plain(ansi: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", ansi)


def hottest_own(text: str) -> int:
    """Own samples of the first row of top's table (0 before there is one)."""
    lines = text.splitlines()
    header = next((i for i, line in enumerate(lines) if "%Own" in line), None)
    if header is None or header + 1 >= len(lines):
        return 0
    cells = lines[header + 1].split()
    return int(cells[2]) if len(cells) > 4 and cells[2].isdigit() else 0


def top_screen(work: Path, users: list[str]) -> str:
    """`qmpprof top` of the guest in a COLUMNS x ROWS tmux pane, captured once the table
    names a workload and its first row has TOP_SAMPLES samples of its own; `q` then."""
    tmux = Tmux()
    command = shlex.join(qmpprof("top", "--qmp-socket", f"./{SOCKET}", *users))
    size = ["-x", str(COLUMNS), "-y", str(ROWS)]
    tmux("new-session", "-d", "-s", tmux.session, "-c", str(work), *size, command)
    try:
        tmux.wait_for(lambda text: "%Own" in text and "crunch" in text, 120)
        screen = tmux.wait_for(lambda text: hottest_own(text) >= TOP_SAMPLES, 120)
        tmux("send-keys", "-t", tmux.session, "q")
        tmux.wait_for(lambda _: "top" not in tmux("list-sessions"), 30)
    finally:
        tmux.kill()
    return screen


def ansi_svg(ansi: str, path: Path, title: str) -> None:
    """The terminal text `ansi` (SGR colours) drawn as an SVG by rich."""
    lines = ansi.rstrip("\n").split("\n")
    while lines and not plain(lines[-1]).strip():
        lines.pop()
    console = Console(
        record=True,
        width=COLUMNS,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
    )
    console.print(Text.from_ansi("\n".join(lines)))
    console.save_svg(str(path), title=title)


def svg_height(svg: Path) -> int:
    return int(float(ET.parse(svg).getroot().get("height", "800")))


def screenshot(chromium: str, page: Path, png: Path, width: int, height: int) -> None:
    """Headless Chromium's picture of `page` in a `width` x `height` window."""
    with tempfile.TemporaryDirectory(prefix="qmpprof-chromium-") as profile:
        command = [chromium, *CHROMIUM_FLAGS, "--hide-scrollbars", "--force-device-scale-factor=1"]
        command += [f"--user-data-dir={profile}"]
        command += [f"--window-size={width},{height}", f"--screenshot={png}", page.as_uri()]
        subprocess.run(command, capture_output=True, timeout=120, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=IMAGES, help="where the pictures go")
    options = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None or shutil.which("tmux") is None:
        raise SystemExit("needs chromium and tmux: make consumers system-deps")
    out: Path = options.out
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="qmpprof-pictures-") as directory:
        work = Path(directory)
        log("booting the Linux demo guest (TCG, 2 vCPUs)...")
        with running_linux(work, *boot_args()) as guest:
            users = user_programs(guest)
            log(f"recording {DURATION_S} s...")
            flamegraph = work / "flamegraph.svg"
            summary = record(users, flamegraph)
            log("running qmpprof top in tmux...")
            top = top_screen(work, users)
        ansi_svg(summary, out / "summary.svg", "qmpprof record (Linux demo guest)")
        ansi_svg(top, out / "top.svg", "qmpprof top (Linux demo guest)")
        screenshot(chromium, flamegraph, out / "flamegraph.png", 1200, svg_height(flamegraph))
    for name in ("flamegraph.png", "summary.svg", "top.svg"):
        log(f"{out / name}: {(out / name).stat().st_size // 1024} KiB")
    log(f"done in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
