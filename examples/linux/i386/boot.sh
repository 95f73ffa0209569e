#!/usr/bin/env bash
# Boot the i386 Linux guest (Debian's 32-bit kernel, linux-image-6.1.0-50-686-pae, and
# this directory's initramfs) under TCG in the background and wait until its init says
# it is ready. Modelled on ../boot.sh, whose options it takes.
#
#   boot.sh --qmp SOCKET [--gdb SOCKET|PORT] [--smp N] [--serial LOG] [--timeout SEC]
#           [--nokaslr] [--abi ABI] [--workloads a,b] [--memory-backend PATH]
#           [--append 'KERNEL ARGS'] [--ram SIZE] [--cpu MODEL] [--retries N]
#   boot.sh stop PID
#
# QEMU is qemu-system-i386 unless $QEMU says otherwise (qemu-system-x86_64 boots it too).
# --cpu passes -cpu MODEL (default: QEMU's own, qemu32 for qemu-system-i386).
# --retries N boots again, up to N times (default 1), when the guest dies or hangs
# before it is ready (a stock kernel under TCG may Oops while booting now and then).
# --workloads picks from crunch, crunchnofp, sysloop, sleeper (default: all four).
# --ram defaults to 512M. --memory-backend keeps the guest's RAM in the file PATH.
# --gdb opens QEMU's gdbstub on a unix socket, or on a TCP port of 127.0.0.1 if a number.
# KASLR is on unless --nokaslr (CONFIG_RANDOMIZE_BASE=y in Debian's 686-pae config).
# On success prints, one per line on stdout:
#   pid=<QEMU pid> kernel=<debug vmlinux> vmlinuz=<boot image> abi=<ABI> qmp=<socket>
#   gdb=<socket, 127.0.0.1:PORT or empty> serial=<log> accel=tcg
#   initramfs=<the cpio booted> user_dir=<this directory's build/> boot_s=<seconds>
#   attempts=<boots it took>
# Everything else (make, downloads, diagnostics) goes to stderr.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/../lib.sh"
QEMU=${QEMU:-qemu-system-i386}
READY_LINE='qmpprof-linux32: ready'
MEMORY=512M

die() {
    echo "boot.sh: $*" >&2
    exit 1
}

if [[ ${1:-} == stop ]]; then  # the example guest's stop: SIGTERM, then SIGKILL, QEMU only
    exec "$HERE/../../guest/boot.sh" "$@"
fi

qmp='' gdb='' smp=2 serial='' timeout=180 kaslr='' abi='' workloads='' membackend=''
append='' cpu='' retries=1
while [[ $# -gt 0 ]]; do
    case $1 in
        --qmp) qmp=${2:?--qmp needs a value}; shift 2 ;;
        --gdb) gdb=${2:?--gdb needs a value}; shift 2 ;;
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
        -h|--help) sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
        *) die "unknown argument '$1'" ;;
    esac
done
[[ -n $qmp ]] || die "--qmp SOCKET is required"
[[ $smp =~ ^[1-9][0-9]*$ ]] || die "--smp must be a positive integer"
[[ $timeout =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a positive integer (seconds)"
[[ $retries =~ ^[0-9]+$ ]] || die "--retries must be a number"
[[ $workloads =~ ^[a-z,]*$ ]] || die "--workloads takes names like crunch,sleeper"
[[ $MEMORY =~ ^[1-9][0-9]*[MG]$ ]] || die "--ram takes a size like 512M or 2G"
[[ $append =~ ^[A-Za-z0-9_.,=\ -]*$ ]] || die "--append takes plain kernel arguments like 'pti=off'"
[[ $cpu =~ ^[A-Za-z0-9_.,=+-]*$ ]] || die "--cpu takes a QEMU CPU model like max or pentium3"
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
# After the fetch: the initramfs takes crc8.ko from the cached .deb.
flock "$HERE/build/.make.lock" make -s -C "$HERE" >&2 || die "building the initramfs failed"
initramfs=$HERE/build/initramfs.cpio

pidfile=$(mktemp "${TMPDIR:-/tmp}/qmpprof-linux32.XXXXXX")
trap 'rm -f "$pidfile"' EXIT
args=(-accel tcg -display none -no-reboot -m "$MEMORY" -smp "$smp" -name qmpprof-linux32
      -kernel "${kernel[vmlinuz]}" -initrd "$initramfs"
      -append "console=ttyS0 panic=-1 $kaslr${workloads:+ qmpprof.workloads=$workloads}${append:+ $append}"
      -serial "file:$serial" -qmp "unix:$qmp,server=on,wait=off"
      -daemonize -pidfile "$pidfile")
[[ -n $cpu ]] && args+=(-cpu "$cpu")
[[ -n $gdb_device ]] && args+=(-gdb "$gdb_device")
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
echo "user_dir=$HERE/build"
echo "boot_s=$((SECONDS - start))"
echo "attempts=$attempt"
