"""Build the small ELF files the unit tests read, from the .c sources in data/."""

import shutil
import subprocess
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


def build_elf(source: str, out_dir: Path, *flags: str) -> Path:
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build test ELF files (make test installs it)")
    output = out_dir / (Path(source).stem + "".join(flags).replace("-", "_") + ".elf")
    subprocess.run(["gcc", *flags, "-o", str(output), str(DATA / source)], check=True)
    return output


@pytest.fixture(scope="session")
def symbols_elf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_elf("symbols.c", tmp_path_factory.mktemp("elf"), "-O1", "-g")
