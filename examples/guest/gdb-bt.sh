#!/usr/bin/env bash
# One-shot backtrace of a running qmpprof example guest through QEMU's gdbstub.
#   gdb-bt.sh GDBSOCK [VARIANT] [extra gdb commands...]
# Attaching stops the VM; the script detaches again, which resumes it.
# (GDB 13 wants a plain path for a unix socket: `target remote /path/gdb.sock`.)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
sock=${1:?usage: gdb-bt.sh GDBSOCK [VARIANT] [gdb commands...]}
variant=${2:-fp}
shift $(( $# >= 2 ? 2 : 1 ))
extra=()
for c in "$@"; do extra+=(-ex "$c"); done
exec gdb -q -batch -nx -ex "file $HERE/build/$variant/kernel.elf" \
    -ex "target remote $sock" -ex bt "${extra[@]}" -ex detach
