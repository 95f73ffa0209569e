#!/usr/bin/env bash
# Boot the Linux example guest (Debian's kernel, our initramfs) under TCG in the
# background and wait until its init says it is ready.
#
#   boot.sh --qmp SOCKET [--gdb SOCKET|PORT] [--smp N] [--serial LOG] [--timeout SEC]
#           [--nokaslr] [--abi ABI] [--extra-qmp SOCKET] [--workloads a,b]
#           [--memory-backend PATH] [--append 'KERNEL ARGS'] [--ram SIZE] [--cpu MODEL]
#           [--demo] [--initrd PATH]
#   boot.sh stop PID
#
# --append adds kernel command-line arguments (e.g. 'pti=on').
# --cpu picks QEMU's CPU model (default qemu64): `max` has what a modern server's
# `-cpu host` gives a guest, 5-level paging (LA57) and PCID among it.
# --ram sets the guest's memory (default 256M; e.g. 2G).
# --memory-backend keeps the guest's RAM in the file PATH (shared), which qmpprof
# --mem-path PATH maps to read guest memory without system calls.
# --abi picks the kernel (default $KERNEL_ABI, else fetch.sh's first; `fetch.sh --list`),
# and so the initramfs: bullseye's kernel boots build/bullseye/'s, with bullseye's libc.
# --demo fetches and builds only what `make demo` boots (fetch.sh --demo): the kernel's
# vmlinuz, no debug vmlinux (kernel= is empty unless cached), and build/demo/'s initramfs
# (build/bullseye/demo/'s), from libc6 alone: its sysroot has no debug files.
# --initrd boots the initramfs PATH instead of ours (builds none): stock/build.sh's
# Debian user space; its /init must print the same ready line. sysroot= is then empty.
# --gdb opens QEMU's gdbstub on a unix socket, or on a TCP port of 127.0.0.1 if a number.
# On success prints, one per line on stdout:
#   pid=<QEMU pid> kernel=<debug vmlinux> vmlinuz=<boot image> abi=<ABI> qmp=<socket>
#   gdb=<socket, 127.0.0.1:PORT or empty> serial=<log> accel=tcg
#   initramfs=<the cpio booted> sysroot=<its files as qmpprof --sysroot takes them>
# Everything else (make, downloads, diagnostics) goes to stderr. The cache is
# $QMPPROF_CACHE, else ~/.cache/qmpprof.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/lib.sh"
QEMU=${QEMU:-qemu-system-x86_64}
READY_LINE='qmpprof-linux: ready'
MEMORY=256M

die() {
    echo "boot.sh: $*" >&2
    exit 1
}

if [[ ${1:-} == stop ]]; then  # the example guest's stop: SIGTERM, then SIGKILL, QEMU only
    exec "$HERE/../guest/boot.sh" "$@"
fi

qmp='' extra_qmp='' gdb='' smp=2 serial='' timeout=120 kaslr='' abi='' workloads=''
membackend='' append='' cpu='' demo='' initrd=''
while [[ $# -gt 0 ]]; do
    case $1 in
        --qmp) qmp=${2:?--qmp needs a value}; shift 2 ;;
        --gdb) gdb=${2:?--gdb needs a value}; shift 2 ;;
        --extra-qmp) extra_qmp=${2:?--extra-qmp needs a value}; shift 2 ;;
        --smp) smp=${2:?--smp needs a value}; shift 2 ;;
        --serial) serial=${2:?--serial needs a value}; shift 2 ;;
        --timeout) timeout=${2:?--timeout needs a value}; shift 2 ;;
        --nokaslr) kaslr=nokaslr; shift ;;
        --abi) abi=${2:?--abi needs a value}; shift 2 ;;
        --workloads) workloads=${2:?--workloads needs a value}; shift 2 ;;
        --memory-backend) membackend=${2:?--memory-backend needs a value}; shift 2 ;;
        --append) append=${2:?--append needs a value}; shift 2 ;;
        --ram) MEMORY=${2:?--ram needs a value}; shift 2 ;;
        --cpu) cpu=${2:?--cpu needs a value}; shift 2 ;;
        --demo) demo=--demo; shift ;;
        --initrd) initrd=${2:?--initrd needs a value}; shift 2 ;;
        -h|--help) sed -n '2,30p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
        *) die "unknown argument '$1'" ;;
    esac
done
[[ -n $qmp ]] || die "--qmp SOCKET is required"
[[ $smp =~ ^[1-9][0-9]*$ ]] || die "--smp must be a positive integer"
[[ $timeout =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a positive integer (seconds)"
[[ $workloads =~ ^[a-z,]*$ ]] || die "--workloads takes names like crunch,sleeper"
[[ $MEMORY =~ ^[1-9][0-9]*[MG]$ ]] || die "--ram takes a size like 256M or 2G"
[[ $cpu =~ ^[A-Za-z0-9_.,=+-]*$ ]] || die "--cpu takes a QEMU CPU model like max or qemu64,+la57"
[[ $append =~ ^[A-Za-z0-9_.,=\ -]*$ ]] || die "--append takes plain kernel arguments like 'pti=on'"
command -v "$QEMU" >/dev/null || die "$QEMU not found"
qmp=$(realpath -m -- "$qmp")
gdb_endpoint
serial=$(realpath -m -- "${serial:-${qmp%.sock}-serial.log}")

cache=${QMPPROF_CACHE:-$HOME/.cache/qmpprof}
mkdir -p "$cache"
# The kernel first: the initramfs holds modules of each kernel whose .deb is cached.
declare -A kernel  # several boot.sh may run at once: one fetch at a time
while IFS='=' read -r key value; do kernel[$key]=$value; done < <(
    flock "$cache/.fetch.lock" "$HERE/fetch.sh" ${demo:+"$demo"} ${abi:+"$abi"})
[[ -n ${kernel[vmlinuz]:-} ]] || die "fetch.sh found no kernel"
# The kernel's release (fetch.sh's release=, empty for the host's) picks the flavour:
# an older release's guest runs that release's libc, in build/RELEASE/ (the demo's in
# its demo/). Without --demo make builds every flavour but the demo's, as the tests use.
flavour=build${kernel[release]:+/${kernel[release]}}${demo:+/demo}
if [[ -n $initrd ]]; then  # another initramfs: none of ours is built, it has no sysroot
    initrd=$(realpath -- "$initrd") || die "no initramfs $initrd"
    [[ -f $initrd ]] || die "no initramfs $initrd"
    sysroot=''
else
    mkdir -p "$HERE/build"
    flock "$HERE/build/.make.lock" make -s -C "$HERE" ${demo:+"$flavour/initramfs.cpio"} >&2 ||
        die "building the initramfs failed"
    flavour=$HERE/$flavour
    initrd=$flavour/initramfs.cpio sysroot=$flavour/sysroot
    [[ -f $initrd ]] || die "no $initrd (make -C $HERE)"
fi

pidfile=$(mktemp "${TMPDIR:-/tmp}/qmpprof-linux.XXXXXX")
trap 'rm -f "$pidfile"' EXIT
args=(-accel tcg -display none -no-reboot -m "$MEMORY" -smp "$smp" -name qmpprof-linux
      -kernel "${kernel[vmlinuz]}" -initrd "$initrd"
      -append "console=ttyS0 quiet panic=-1 $kaslr${workloads:+ qmpprof.workloads=$workloads}${append:+ $append}"
      -serial "file:$serial" -qmp "unix:$qmp,server=on,wait=off"
      -daemonize -pidfile "$pidfile")
[[ -n $cpu ]] && args+=(-cpu "$cpu")
[[ -n $gdb_device ]] && args+=(-gdb "$gdb_device")
[[ -n $membackend ]] && memory_backend "$membackend" "$MEMORY"
# A second QMP monitor: another client (a benchmark watching for STOP) next to qmpprof.
[[ -n $extra_qmp ]] && args+=(-qmp "unix:$(realpath -m -- "$extra_qmp"),server=on,wait=off")
rm -f "$serial"
"$QEMU" "${args[@]}" </dev/null >/dev/null || die "QEMU failed to start"
pid=$(tr -d ' \n' <"$pidfile")

deadline=$((SECONDS + timeout))
until grep -qF "$READY_LINE" "$serial" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null || ((SECONDS >= deadline)); then
        "$0" stop "$pid" >/dev/null 2>&1 || true
        die "guest not ready within ${timeout}s (serial log: $serial, last line: '$(tail -n 1 "$serial" 2>/dev/null | tr -d '\r')')"
    fi
    sleep 0.2
done

echo "pid=$pid"
echo "kernel=${kernel[vmlinux]}"
echo "vmlinuz=${kernel[vmlinuz]}"
echo "abi=${kernel[abi]}"
echo "qmp=$qmp"
echo "gdb=$gdb"
echo "serial=$serial"
echo "accel=tcg"
echo "initramfs=$initrd"
echo "sysroot=$sysroot"
