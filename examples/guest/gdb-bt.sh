#!/usr/bin/env bash
# One-shot backtrace of a running qmpprof example guest through QEMU's gdbstub.
#   gdb-bt.sh GDBSOCK [VARIANT] [extra gdb commands...]
# VARIANT is the build directory: fp, nofp, or i386-fp, i386-nofp for the
# i386 build (boot.sh --arch i386); the latter runs `set architecture i386`
# and connects through gdb-i386-proxy.py, which presents a 32-bit CPU also
# when the guest runs under qemu-system-x86_64 (whose gdbstub describes an
# x86-64 CPU only).
# Attaching stops the VM; the script detaches again, which resumes it.
# (GDB 13 wants a plain path for a unix socket: `target remote /path/gdb.sock`.)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
sock=${1:?usage: gdb-bt.sh GDBSOCK [VARIANT] [gdb commands...]}
variant=${2:-fp}
shift $(( $# >= 2 ? 2 : 1 ))
extra=()
for c in "$@"; do extra+=(-ex "$c"); done
if [[ $variant == i386-* ]]; then
    exec gdb -q -batch -nx -ex 'set architecture i386' -ex 'set remotetimeout 10' \
        -ex "file $HERE/build/$variant/kernel.elf" \
        -ex "target remote | $HERE/gdb-i386-proxy.py $sock" -ex bt "${extra[@]}" -ex detach
fi
exec gdb -q -batch -nx -ex "file $HERE/build/$variant/kernel.elf" \
    -ex "target remote $sock" -ex bt "${extra[@]}" -ex detach
