#!/usr/bin/env python3
"""../mksysroot.py for the AArch64 guest: the same arguments and tree, with ld.so's
default library directories those of Debian's arm64 multiarch (aarch64-linux-gnu), where
it finds libc.so.6 and libqmpwork.so.1 (the guest has no ld.so.cache).

    mksysroot.py OUTPUT LIBC_TREE FILE=GUEST_PATH...
"""

import sys
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in ../
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mksysroot  # noqa: E402  (../mksysroot.py)

mksysroot.LIBRARY_DIRS = ("lib/aarch64-linux-gnu", "usr/lib/aarch64-linux-gnu", "lib", "usr/lib")

if __name__ == "__main__":
    mksysroot.main()
