#!/usr/bin/env bash
# Boot the AArch64 Linux guest (one of Debian's arm64 kernels, this directory's
# initramfs) under TCG in the background and wait until its init says it is ready.
# Modelled on ../i386/boot.sh, whose options it takes.
#
#   boot.sh --qmp SOCKET [--gdb SOCKET|PORT] [--smp N] [--serial LOG] [--timeout SEC]
#           [--nokaslr] [--abi ABI] [--extra-qmp SOCKET] [--workloads a,b] [--memory-backend PATH]
#           [--append 'KERNEL ARGS'] [--ram SIZE] [--cpu MODEL] [--retries N]
#   boot.sh stop PID
#
# QEMU is qemu-system-aarch64 -M virt unless $QEMU says otherwise.
# --abi picks the kernel (default $KERNEL_ABI, else fetch.sh's first; `fetch.sh --list`).
# --cpu passes -cpu MODEL (default max: pointer authentication, BTI, LPA2; cortex-a57
# has none of them). --ram defaults to 1G. --smp defaults to 2.
# --retries N boots again, up to N times (default 1), when the guest dies, hangs or
# Oopses before it is ready.
# --workloads picks from ../init.c's (crunch, crunchnofp, sysloop, pinned, sleeper by
# default; dynwork, loopread, timeloop, spawner only when named).
# --memory-backend keeps the guest's RAM in the file PATH (shared).
# --gdb opens QEMU's gdbstub on a unix socket, or on a TCP port of 127.0.0.1 if a number.
# KASLR is on unless --nokaslr (CONFIG_RANDOMIZE_BASE=y; the virt board's device tree
# gives the kernel a kaslr-seed).
# On success prints, one per line on stdout:
#   pid=<QEMU pid> kernel=<debug vmlinux> vmlinuz=<boot image> abi=<ABI> qmp=<socket>
#   gdb=<socket, 127.0.0.1:PORT or empty> serial=<log> accel=tcg
#   initramfs=<the cpio booted> sysroot=<its files as qmpprof --sysroot takes them>
#   user_dir=<this directory's build/> boot_s=<seconds> attempts=<boots it took>
# Everything else (make, downloads, diagnostics) goes to stderr. The cache is
# $QMPPROF_CACHE, else ~/.cache/qmpprof.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/../lib.sh"
QEMU=${QEMU:-qemu-system-aarch64}
READY_LINE='qmpprof-linux: ready'
MEMORY=1G

die() {
    echo "boot.sh: $*" >&2
    exit 1
}

if [[ ${1:-} == stop ]]; then  # the example guest's stop: SIGTERM, then SIGKILL, QEMU only
    exec "$HERE/../../guest/boot.sh" "$@"
fi

qmp='' extra_qmp='' gdb='' smp=2 serial='' timeout=180 kaslr='' abi='' workloads='' membackend=''
append='' cpu=max retries=1
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
        --retries) retries=${2:?--retries needs a value}; shift 2 ;;
        -h|--help) sed -n '2,30p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
        *) die "unknown argument '$1'" ;;
    esac
done
[[ -n $qmp ]] || die "--qmp SOCKET is required"
[[ $smp =~ ^[1-9][0-9]*$ ]] || die "--smp must be a positive integer"
[[ $timeout =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a positive integer (seconds)"
[[ $retries =~ ^[0-9]+$ ]] || die "--retries must be a number"
[[ $workloads =~ ^[a-z,]*$ ]] || die "--workloads takes names like crunch,sleeper"
[[ $MEMORY =~ ^[1-9][0-9]*[MG]$ ]] || die "--ram takes a size like 512M or 2G"
[[ $append =~ ^[A-Za-z0-9_.,=\ -]*$ ]] || die "--append takes plain kernel arguments like 'nosmp'"
[[ $cpu =~ ^[A-Za-z0-9_.,=+-]+$ ]] || die "--cpu takes a QEMU CPU model like max or cortex-a57"
command -v "$QEMU" >/dev/null || die "$QEMU not found"
qmp=$(realpath -m -- "$qmp")
gdb_endpoint
serial=$(realpath -m -- "${serial:-${qmp%.sock}-serial.log}")

cache=${QMPPROF_CACHE:-$HOME/.cache/qmpprof}
mkdir -p "$cache" "$HERE/build"
declare -A kernel  # several boot.sh may run at once: one fetch at a time
while IFS='=' read -r key value; do kernel[$key]=$value; done < <(
    flock "$cache/.fetch.lock" "$HERE/fetch.sh" $abi)
[[ -n ${kernel[vmlinuz]:-} ]] || die "fetch.sh found no kernel"
# After the fetch: the initramfs takes loop.ko from each cached kernel .deb.
flock "$HERE/build/.make.lock" make -s -C "$HERE" >&2 || die "building the initramfs failed"
initramfs=$HERE/build/initramfs.cpio

pidfile=$(mktemp "${TMPDIR:-/tmp}/qmpprof-linux-aarch64.XXXXXX")
trap 'rm -f "$pidfile"' EXIT
args=(-M virt -cpu "$cpu" -accel tcg -display none -no-reboot -m "$MEMORY" -smp "$smp"
      -name qmpprof-linux-aarch64 -kernel "${kernel[vmlinuz]}" -initrd "$initramfs"
      -append "console=ttyAMA0 panic=-1 $kaslr${workloads:+ qmpprof.workloads=$workloads}${append:+ $append}"
      -serial "file:$serial" -qmp "unix:$qmp,server=on,wait=off"
      -daemonize -pidfile "$pidfile")
[[ -n $gdb_device ]] && args+=(-gdb "$gdb_device")
[[ -n $extra_qmp ]] && args+=(-qmp "unix:$(realpath -m -- "$extra_qmp"),server=on,wait=off")
[[ -n $membackend ]] && memory_backend "$membackend" "$MEMORY"

boot_until_ready

echo "pid=$pid"
echo "kernel=${kernel[vmlinux]}"
echo "vmlinuz=${kernel[vmlinuz]}"
echo "abi=${kernel[abi]}"
echo "qmp=$qmp"
echo "gdb=$gdb"
echo "serial=$serial"
echo "accel=tcg"
echo "initramfs=$initramfs"
echo "sysroot=$HERE/build/sysroot"
echo "user_dir=$HERE/build"
echo "boot_s=$((SECONDS - start))"
echo "attempts=$attempt"
