#!/usr/bin/env bash
# GDB's stacks of the i386 Linux guest (gdb_stacks.py), the oracle for qmpprof: attach
# to QEMU's gdbstub (boot.sh --gdb SOCKET|PORT) N times, INTERVAL seconds apart, each
# time printing every vCPU's task, GDB's kernel backtrace and the user stack of our
# programs, then detaching (the guest runs on).
#
#   gdb-stacks.sh --gdb SOCKET|HOST:PORT [--kernel VMLINUX] [--samples N] [--interval S]
#                 [--slide 0xOFFSET | --serial LOG]
#
# --kernel defaults to the cached 6.1.0-50-686-pae debug vmlinux (its vdso32.so beside it).
# --slide is the KASLR offset; --serial LOG (boot.sh's serial=) computes it: the running
# asm_exc_divide_error (init's "qmpprof-linux32: kallsyms" line) less the vmlinux's.
# GDB is given the vmlinux relocated by it (add-symbol-file -o). Needs qemu-system-i386's
# gdbstub: qemu-system-x86_64's describes 64-bit registers, which i386 GDB refuses.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${QMPPROF_CACHE:-$HOME/.cache/qmpprof}
serial='' gdb_target='' kernel=$cache/linux/6.1.0-50-686-pae/vmlinux samples=1 interval=1 slide=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --gdb) gdb_target=$2; shift 2 ;;
        --kernel) kernel=$2; shift 2 ;;
        --samples) samples=$2; shift 2 ;;
        --interval) interval=$2; shift 2 ;;
        --slide) slide=$2; shift 2 ;;
        --serial) serial=$2; shift 2 ;;
        *) echo "gdb-stacks.sh: unknown argument '$1'" >&2; exit 1 ;;
    esac
done
[[ -n $gdb_target ]] || { echo "gdb-stacks.sh: --gdb is required" >&2; exit 1; }
if [[ -n $serial ]]; then
    running=$(sed -n 's/^qmpprof-linux32: kallsyms \([0-9a-f]*\) asm_exc_divide_error.*/\1/p' "$serial" | head -n 1)
    linked=$(nm "$kernel" | awk '$3 == "asm_exc_divide_error" {print $1}' | head -n 1)
    [[ -n $running && -n $linked ]] || { echo "gdb-stacks.sh: no kallsyms line in $serial" >&2; exit 1; }
    slide=$(printf '%#x' $((0x$running - 0x$linked)))
    echo "gdb-stacks.sh: KASLR slide $slide" >&2
fi
if [[ $slide == 0 || $slide == 0x0 ]]; then
    load=(-ex "file $kernel")
else
    load=(-ex "add-symbol-file $kernel -o $slide")
fi
# One GDB loads the vmlinux (300 MB of DWARF: most of the time) and attaches N times.
QMPPROF_I386_USER_DIR=$HERE/build QMPPROF_I386_VDSO=$(dirname "$kernel")/vdso32.so QMPPROF_I386_GDB=$gdb_target \
QMPPROF_I386_SAMPLES=$samples QMPPROF_I386_INTERVAL=$interval \
    gdb -nx -batch -ex 'set pagination off' -ex 'set confirm off' -ex 'set width 0' \
        "${load[@]}" -ex "source $HERE/gdb_stacks.py" 2>&1 |
    grep -vE '^(warning: No executable|Remote debugging|\[Inferior|[0-9]+\s+/build/|0x[0-9a-f]+ in |Reading symbols)' || true
