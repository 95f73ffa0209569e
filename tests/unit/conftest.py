"""Build the small ELF files the unit tests read, from the .c sources in data/.

Each (source, flags) is compiled once a session (a pristine copy kept until it ends).
"""

import atexit
import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


#: (source, flags) -> a pristine copy of the ELF built from them: a second request copies
#: it instead of running gcc again (a test may change or move the copy it gets).
_BUILT: dict[tuple[str, tuple[str, ...], str], Path] = {}


@functools.cache
def _built_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="qmpprof-elf-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def build_elf(source: str, out_dir: Path, *flags: str, cc: str = "gcc") -> Path:
    """`source` (in data/) built by `cc` with `flags` (once a session, then copied)."""
    if shutil.which(cc) is None:
        pytest.fail(f"{cc} is needed to build test ELF files (make test installs it)")
    name = Path(source).stem + "".join(flags).replace("-", "_")
    output = out_dir / (name + ("" if cc == "gcc" else f"_{cc}") + ".elf")
    pristine = _BUILT.get((source, flags, cc))
    if pristine is None:
        subprocess.run([cc, *flags, "-o", str(output), str(DATA / source)], check=True)
        pristine = _built_dir() / f"{len(_BUILT)}-{output.name}"
        shutil.copy2(output, pristine)
        _BUILT[(source, flags, cc)] = pristine
    else:
        shutil.copy2(pristine, output)
    return output


@pytest.fixture(scope="session")
def symbols_elf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_elf("symbols.c", tmp_path_factory.mktemp("elf"), "-O1", "-g")


CHAIN_FUNCTIONS = "leaf,keeps_registers,variable_array,realigned,main"
CHAIN_BUILDS = {
    "O2-omit-fp": ("-O2", "-fomit-frame-pointer"),
    "O2-omit-fp-debug-frame-only": (
        "-O2",
        "-fomit-frame-pointer",
        "-fno-asynchronous-unwind-tables",
    ),
    "O0": ("-O0",),
    "O1-fp": ("-O1", "-fno-omit-frame-pointer"),
}


def capture_with_gdb(
    program: Path, functions: str, output: Path, pie: bool = False
) -> list[dict[str, object]]:
    """Stops on every instruction of `functions`; GDB's registers, stack and frames at each
    (`pie`: the program is position-independent, its addresses known once loaded)."""
    import json
    import os

    if shutil.which("gdb") is None:
        pytest.fail("gdb is needed as the unwinding oracle (make test installs it)")
    env = {
        **os.environ,
        "QMPPROF_PROGRAM": str(program),
        "QMPPROF_FUNCTIONS": functions,
        "QMPPROF_OUTPUT": str(output),
        **({"QMPPROF_PIE": "1"} if pie else {}),
    }
    script = Path(__file__).parent / "gdb_capture.py"
    subprocess.run(
        ["gdb", "-batch", "-nx", "-x", str(script)],
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return [json.loads(line) for line in output.read_text().splitlines()]


#: The build `make unit` unwinds (its CFI has the most to say); GDB runs under each of the
#: others for a second or so, so they are `slow`: `make test` runs every build.
QUICK_CHAIN_BUILD = "O2-omit-fp"


@pytest.fixture(
    scope="session",
    params=[
        pytest.param(name, marks=() if name == QUICK_CHAIN_BUILD else pytest.mark.slow)
        for name in sorted(CHAIN_BUILDS)
    ],
)
def chain_capture(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, list[dict[str, object]]]:
    """(build name, ELF, GDB's stops) for cfi_chain.c built one way."""
    name = request.param
    out = tmp_path_factory.mktemp(name)
    elf = build_elf("cfi_chain.c", out, "-g", "-static", *CHAIN_BUILDS[name])
    return name, elf, capture_with_gdb(elf, CHAIN_FUNCTIONS, out / "stops.jsonl")


class NoFunctionFacts:
    """What a unit test's CfiLookup knows of no function but by its rows: no function
    starts (by symbol), no word sizes (the unwind's own word everywhere)."""

    def function_start(self, address: int) -> int | None:
        return None

    def word_size(self, address: int) -> int | None:
        return None

    def words(self) -> frozenset[int]:
        return frozenset()
