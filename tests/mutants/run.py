"""Deliberately broken builds, and the tests that must catch each (`make mutants`).

Each mutant replaces one piece of qmpprof's source (the text must occur exactly once),
in a copy of the work tree, and runs the tests named for it there: caught when they
fail. Before any mutant, the same tests run on the unchanged copy and must pass, so a
catch is the mutant's doing. The tests named are the cheapest that catch each; tests/
README.md lists what each mutant is caught by.

    python -m tests.mutants.run [NAME ...]   # all mutants, or those named
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Built, not tracked, and read by the tests: copied beside the tracked files.
BUILT = ("examples/guest/build", "examples/linux/build")
GDB_LINUX = "tests/integration/test_linux_gdb_agreement.py"
GDB_GUEST = "tests/integration/test_gdb_agreement.py"
#: How the unwinder appends a caller's frame: dropping the frames one recovery found.
APPEND = "            frames.append(FrameAddress(caller_pc, kind, how))"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    original: str
    mutated: str
    tests: tuple[str, ...]


def dropped(recovery: str, *tests: str) -> Mutant:
    """The unwinder's frames found by `recovery` left out of every stack."""
    mutated = f"            if how is not Recovery.{recovery}:\n                {APPEND.strip()}"
    return Mutant(
        f"{recovery.lower().replace('_', '-')} frames dropped",
        "qmpprof/unwind/unwinder.py",
        APPEND,
        mutated,
        tests,
    )


MUTANTS = (
    dropped("CFI", "tests/unit/test_cfi_unwind.py"),
    dropped("FRAME_POINTER", "tests/unit/test_framepointer.py"),
    dropped("SYSTEM_CALL", "tests/unit/test_orc.py"),
    Mutant(
        "saved-user-registers frame dropped",
        "qmpprof/analysis.py",
        "frames = (*stack.frames, first, *rest.frames[1:])",
        "frames = (*stack.frames, *rest.frames[1:])",
        (f"{GDB_LINUX}::test_a_stop_on_the_way_back_to_user_space_agrees_with_gdb",),
    ),
    Mutant(
        "a label inside a function not taken for a function's start",
        "qmpprof/address_space.py",
        "return found is not None and found[0].starts_at(address - found[1])",
        "return found is not None and (found[0].lookup(address - found[1]) or (0, 1))[1] == 0",
        (f"{GDB_LINUX}::test_a_stop_at_a_retpoline_thunk_agrees_with_gdb",),
    ),
    Mutant(
        "KASLR slide from the IDT one byte off",
        "qmpprof/record/relocation.py",
        "return KernelPlacement(slide, regs.vcpu)",
        "return KernelPlacement(slide + 1, regs.vcpu)",
        ("tests/integration/test_linux_kaslr.py",),
    ),
    Mutant(
        "KASLR slide from VMCOREINFO one byte off",
        "qmpprof/commands/connect.py",
        "    slide = found.info.kernel_offset\n",
        "    slide = found.info.kernel_offset + 1\n",
        ("tests/integration/test_linux_from_memory.py",),
    ),
    Mutant(
        "kallsyms names shifted by one",
        "qmpprof/guest/linux/kallsyms.py",
        '    return "".join(types), names\n',
        '    return "".join(types), names[1:] + names[:1]\n',
        ("tests/unit/test_kernel_from_memory.py",),
    ),
    Mutant(
        "halted vCPUs called kernel, not idle",
        "qmpprof/guest/mode.py",
        "        return Mode.IDLE\n",
        "        return Mode.KERNEL\n",
        (f"{GDB_GUEST}",),
    ),
    Mutant(
        "Linux idle tasks labelled as a process",
        "qmpprof/guest/linux/adapter.py",
        "        if tid == 0:\n            return IDLE_CONTEXT\n",
        "        if tid == 0:\n            return Process(0, 'swapper')\n",
        (f"{GDB_LINUX}::test_idle_samples_agree_with_gdb",),
    ),
)


def copy_tree(destination: Path) -> None:
    """The tracked and untracked-not-ignored files, and the built guests."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = ROOT / os.fsdecode(name)
        if source.is_file():
            target = destination / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    for built in BUILT:
        if (ROOT / built).is_dir():
            shutil.copytree(ROOT / built, destination / built, symlinks=True)


def apply(tree: Path, mutant: Mutant) -> None:
    path = tree / mutant.path
    text = path.read_text()
    count = text.count(mutant.original)
    if count != 1:
        sys.exit(f"mutants: {mutant.name}: its text occurs {count} times in {mutant.path}")
    path.write_text(text.replace(mutant.original, mutant.mutated))


def run_tests(tree: Path, tests: tuple[str, ...]) -> tuple[int, list[str], float]:
    """pytest's status, the tests that failed, and the seconds it took."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-rf", "-p", "no:cacheprovider", *tests],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", done.stdout, re.MULTILINE)
    return done.returncode, failed, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutants to run (all if none)")
    wanted = parser.parse_args().names
    mutants = [m for m in MUTANTS if not wanted or m.name in wanted]
    if not mutants:
        sys.exit(f"mutants: none named {wanted}; there are: {[m.name for m in MUTANTS]}")
    with tempfile.TemporaryDirectory(prefix="qmpprof-mutants-") as scratch:
        base = Path(scratch) / "unchanged"
        copy_tree(base)
        tests = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
        status, failed, seconds = run_tests(base, tests)
        if status != 0:
            print(f"the unchanged tree fails ({status}): {failed}: no mutant can be judged")
            return 1
        print(f"unchanged: {len(tests)} test selections pass ({seconds:.0f} s)")
        missed = 0
        for number, mutant in enumerate(mutants):
            tree = Path(scratch) / f"mutant-{number}"
            shutil.copytree(base, tree, symlinks=True)
            apply(tree, mutant)
            status, failed, seconds = run_tests(tree, mutant.tests)
            caught = status == 1 and failed
            missed += not caught
            verdict = f"caught by {', '.join(failed)}" if caught else f"MISSED (pytest {status})"
            print(f"{mutant.name}: {verdict} ({seconds:.0f} s)", flush=True)
            shutil.rmtree(tree)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
