#!/usr/bin/env bash
# Boot the qmpprof example guest in the background and wait until it is ready.
#
#   boot.sh --qmp SOCKET [--gdb SOCKET] [--smp N] [--accel tcg[,thread=single|multi]|kvm|auto]
#           [--serial LOG] [--variant fp] [--memory-backend PATH] [--timeout SEC]
#           [--workload kernel|user|compat] [--extra-qmp SOCKET]
#           [--arch x86_64|i386|aarch64] [--paging 2level|pae] [--qemu-binary QEMU]
#           [--cpu MODEL]   (aarch64: the virt board's CPU, default max)
#   boot.sh stop PID
#
# On success prints, one per line on stdout:
#   pid=<QEMU pid> kernel=<abs path of kernel.elf> qmp=<socket> gdb=<socket or empty>
#   serial=<log> accel=<tcg|kvm> user_dir=<abs path of build/VARIANT/user>
# (--arch i386: build/i386-VARIANT/..., --arch aarch64: build/aarch64-VARIANT/...
# under qemu-system-aarch64 -M virt -cpu max). Everything else (make output,
# diagnostics) goes to stderr.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
qemu_given=${QEMU:+1}       # --arch aarch64 picks qemu-system-aarch64 unless given
QEMU=${QEMU:-qemu-system-x86_64}
READY_LINE='qmpprof-guest: ready'
MEMORY=128M
KVM_PROBE_TIMEOUT=${KVM_PROBE_TIMEOUT:-5}   # seconds
KVM_MIN_RATE=${KVM_MIN_RATE:-10000000}       # workload_progress rounds per second

die() {
    echo "boot.sh: $*" >&2
    exit 1
}

usage() {   # usage EXIT_CODE
    sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit "$1"
}

# alive PID: the process exists and is not a zombie.
alive() {
    local state
    kill -0 "$1" 2>/dev/null || return 1
    state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ $state != Z ]]
}

# stop_qemu PID: SIGTERM, wait up to 5 s, then SIGKILL. Only QEMU processes.
stop_qemu() {
    local pid=$1 comm i
    [[ $pid =~ ^[0-9]+$ ]] || die "stop: not a pid: '$pid'"
    alive "$pid" || return 0
    comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
    [[ $comm == qemu-system* ]] || die "stop: pid $pid is not a QEMU process (comm='$comm')"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        alive "$pid" || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        alive "$pid" || return 0
        sleep 0.1
    done
    die "stop: pid $pid survived SIGKILL"
}

if [[ ${1:-} == stop ]]; then
    [[ $# -eq 2 ]] || die "usage: boot.sh stop PID"
    stop_qemu "$2"
    exit 0
fi

qmp='' extra_qmp='' gdb='' smp=1 accel=auto serial='' variant=fp membackend='' timeout=30 workload=kernel
arch=x86_64 paging='' cpu_model=''
while [[ $# -gt 0 ]]; do
    case $1 in
        --qmp) qmp=${2:?--qmp needs a value}; shift 2 ;;
        --gdb) gdb=${2:?--gdb needs a value}; shift 2 ;;
        --extra-qmp) extra_qmp=${2:?--extra-qmp needs a value}; shift 2 ;;
        --smp) smp=${2:?--smp needs a value}; shift 2 ;;
        --accel) accel=${2:?--accel needs a value}; shift 2 ;;
        --serial) serial=${2:?--serial needs a value}; shift 2 ;;
        --variant) variant=${2:?--variant needs a value}; shift 2 ;;
        --memory-backend) membackend=${2:?--memory-backend needs a value}; shift 2 ;;
        --timeout) timeout=${2:?--timeout needs a value}; shift 2 ;;
        --workload) workload=${2:?--workload needs a value}; shift 2 ;;
        --arch) arch=${2:?--arch needs a value}; shift 2 ;;
        --paging) paging=${2:?--paging needs a value}; shift 2 ;;
        --cpu) cpu_model=${2:?--cpu needs a value}; shift 2 ;;
        --qemu-binary) QEMU=${2:?--qemu-binary needs a value}; qemu_given=1; shift 2 ;;
        -h|--help) usage 0 ;;
        *) echo "boot.sh: unknown argument '$1'" >&2; usage 2 ;;
    esac
done
[[ -n $qmp ]] || die "--qmp SOCKET is required"
[[ $smp =~ ^[1-9][0-9]*$ ]] || die "--smp must be a positive integer"
[[ $timeout =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a positive integer (seconds)"
[[ $variant =~ ^[A-Za-z0-9_]+$ ]] || die "bad --variant '$variant'"
case $accel in tcg|tcg,thread=single|tcg,thread=multi|kvm|auto) ;; *) die "--accel must be tcg, tcg,thread=single, tcg,thread=multi, kvm or auto" ;; esac
case $workload in kernel|user|compat) ;; *) die "--workload must be kernel, user or compat" ;; esac
case $arch in x86_64|i386|aarch64) ;; *) die "--arch must be x86_64, i386 or aarch64" ;; esac
# compat: a 32-bit process in compatibility mode under the 64-bit kernel
[[ $workload == compat && $arch != x86_64 ]] && die "--workload compat is for --arch x86_64 only"
[[ -z ${cpu_model:-} || $arch == aarch64 ]] || die "--cpu is for --arch aarch64 only"
[[ ${cpu_model:-max} =~ ^[A-Za-z0-9_.,=-]+$ ]] || die "bad --cpu '$cpu_model'"
if [[ $arch == aarch64 ]]; then
    [[ -z $paging ]] || die "--paging is for --arch i386 only"
    [[ -n $qemu_given ]] || QEMU=qemu-system-aarch64
elif [[ $arch == i386 ]]; then
    case ${paging:=2level} in 2level|pae) ;; *) die "--paging must be 2level or pae" ;; esac
elif [[ -n $paging ]]; then
    die "--paging is for --arch i386 only (x86_64 runs in long mode)"
fi
command -v "$QEMU" >/dev/null || die "$QEMU not found"

qmp=$(realpath -m -- "$qmp")
[[ -n $gdb ]] && gdb=$(realpath -m -- "$gdb")
if [[ -z $serial ]]; then
    serial="${qmp%.sock}-serial.log"
fi
serial=$(realpath -m -- "$serial")
[[ -n $membackend ]] && membackend=$(realpath -m -- "$membackend")

# ---- build (serialized: several boot.sh may run at once) ----
mkdir -p "$HERE/build"
if [[ $arch == x86_64 ]]; then
    flock "$HERE/build/.make.lock" make -s -C "$HERE" ARCH=x86_64 VARIANT="$variant" >&2 ||
        die "build of variant '$variant' failed"
    kernel_elf="$HERE/build/$variant/kernel.elf"
    kernel_boot="$HERE/build/$variant/kernel.boot"
    user_dir="$HERE/build/$variant/user"
elif [[ $arch == aarch64 ]]; then
    # aarch64: kernel.elf is the boot image (QEMU loads it at its LMA, -M virt).
    flock "$HERE/build/.make.lock" make -s -C "$HERE" ARCH=aarch64 VARIANT="$variant" >&2 ||
        die "build of variant '$variant' (aarch64) failed"
    kernel_elf="$HERE/build/aarch64-$variant/kernel.elf"
    kernel_boot=$kernel_elf
    user_dir="$HERE/build/aarch64-$variant/user"
else
    # i386: kernel.elf (ELF32 multiboot) is the boot image itself.
    flock "$HERE/build/.make.lock" make -s -C "$HERE" ARCH=i386 VARIANT="$variant" >&2 ||
        die "build of variant '$variant' (i386) failed"
    kernel_elf="$HERE/build/i386-$variant/kernel.elf"
    kernel_boot=$kernel_elf
    user_dir="$HERE/build/i386-$variant/user"
fi
[[ -f $kernel_elf && -f $kernel_boot ]] || die "build did not produce $kernel_elf"

tmpdir=$(mktemp -d "${TMPDIR:-/tmp}/qmpprof-guest.XXXXXX")
started_pid=''   # QEMU to stop if we exit before handing it over
cleanup() {
    if [[ -n $started_pid ]]; then stop_qemu "$started_pid" >/dev/null 2>&1 || true; fi
    rm -rf "$tmpdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# The board: the PC default for x86, the virt board for aarch64.
machine_args=()
[[ $arch == aarch64 ]] && machine_args=(-M virt -cpu "${cpu_model:-max}")

# start_qemu ACCEL SERIAL_LOG [extra QEMU args...]: daemonized QEMU; prints its pid.
start_qemu() {
    local acc=$1 log=$2 pidfile="$tmpdir/qemu.pid" errlog="$tmpdir/qemu.err"
    shift 2
    rm -f "$log" "$pidfile"
    if ! "$QEMU" ${machine_args[@]+"${machine_args[@]}"} -accel "$acc" -display none -no-reboot -m "$MEMORY" \
        -name qmpprof-guest -kernel "$kernel_boot" -serial "file:$log" \
        -daemonize -pidfile "$pidfile" "$@" </dev/null >/dev/null 2>"$errlog"; then
        echo "boot.sh: QEMU ($acc) failed to start: $(tr '\n' ' ' <"$errlog")" >&2
        return 1
    fi
    [[ -s $pidfile ]] || { echo "boot.sh: QEMU wrote no pid file" >&2; return 1; }
    tr -d ' \n' <"$pidfile"
}

# wait_ready PID LOG SECONDS: until the ready line is in LOG; fails if QEMU dies.
wait_ready() {
    local pid=$1 log=$2 deadline=$((SECONDS + $3))
    while ((SECONDS < deadline)); do
        if [[ -f $log ]] && grep -qxF "$READY_LINE" "$log"; then
            return 0
        fi
        alive "$pid" || return 1
        sleep 0.1
    done
    grep -qxF "$READY_LINE" "$log" 2>/dev/null
}

# probe_check SOCKET ADDR: prints "<run state> <workload_progress rounds per second>"
# measured over 0.5 s through QMP (ADDR = guest virtual address of the counter).
probe_check() {
    command -v python3 >/dev/null || { echo "running 0"; return 0; }
    python3 - "$1" "$2" <<'PY' 2>/dev/null || echo "unknown 0"
import json, socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect(sys.argv[1])
f = s.makefile("rw")
json.loads(f.readline())                       # greeting
def cmd(name, **args):
    msg = {"execute": name}
    if args:
        msg["arguments"] = args
    f.write(json.dumps(msg) + "\n")
    f.flush()
    while True:
        r = json.loads(f.readline())
        if "return" in r or "error" in r:
            return r.get("return")
def progress():
    out = cmd("human-monitor-command", **{"command-line": "x /1gx 0x" + sys.argv[2]})
    return int(out.split(":")[1].split()[0], 16), time.monotonic()
cmd("qmp_capabilities")
p0, t0 = progress()
time.sleep(0.5)
p1, t1 = progress()
print(cmd("query-status")["status"], int((p1 - p0) / (t1 - t0)))
PY
}

# probe_kvm: a short throw-away KVM boot must reach the ready line within
# KVM_PROBE_TIMEOUT seconds, keep running, and run the workload at least at
# KVM_MIN_RATE leaf rounds per second (a broken or fully emulated "KVM" can be
# thousands of times slower than TCG).
probe_kvm() {
    [[ -r /dev/kvm && -w /dev/kvm ]] || return 1
    local pid status rate addr
    addr=$(nm "$kernel_elf" | awk '$3 == "workload_progress" {print $1}')
    pid=$(start_qemu kvm "$tmpdir/probe-serial.log" \
        -qmp "unix:$tmpdir/probe-qmp.sock,server=on,wait=off" 2>/dev/null) || return 1
    started_pid=$pid
    if ! wait_ready "$pid" "$tmpdir/probe-serial.log" "$KVM_PROBE_TIMEOUT"; then
        stop_qemu "$pid"
        started_pid=''
        echo "boot.sh: KVM probe: no ready line within ${KVM_PROBE_TIMEOUT}s, using TCG" >&2
        return 1
    fi
    read -r status rate < <(probe_check "$tmpdir/probe-qmp.sock" "$addr")
    stop_qemu "$pid"
    started_pid=''
    if [[ $status != running ]]; then
        echo "boot.sh: KVM probe: guest state '$status', using TCG" >&2
        return 1
    fi
    if ((rate < KVM_MIN_RATE)); then
        echo "boot.sh: KVM probe: guest too slow under KVM ($rate rounds/s < $KVM_MIN_RATE), using TCG" >&2
        return 1
    fi
    return 0
}

if [[ $accel == auto && $arch == aarch64 ]]; then
    accel=tcg       # no KVM for an Arm guest on this (x86) host: no probe
elif [[ $accel == auto ]]; then
    if probe_kvm; then accel=kvm; else accel=tcg; fi
fi

# The workload (and for i386 the paging mode) is chosen on the multiboot
# command line (the KVM probe above always runs the default kernel workload
# and paging mode: it only measures the accelerator).
cmdline="workload=$workload"
[[ $arch == i386 ]] && cmdline+=" paging=$paging"
args=(-smp "$smp" -append "$cmdline" -qmp "unix:$qmp,server=on,wait=off")
# A second QMP monitor: another client (a debugger, libvirt, a test) next to qmpprof.
[[ -n $extra_qmp ]] && args+=(-qmp "unix:$(realpath -m -- "$extra_qmp"),server=on,wait=off")
[[ -n $gdb ]] && args+=(-gdb "unix:$gdb,server=on,wait=off")
if [[ -n $membackend ]]; then
    args+=(-object "memory-backend-file,id=mem,size=$MEMORY,mem-path=$membackend,share=on"
           -machine memory-backend=mem)
fi

pid=$(start_qemu "$accel" "$serial" "${args[@]}") || exit 1
started_pid=$pid
if ! wait_ready "$pid" "$serial" "$timeout"; then
    last=$(tail -n 1 "$serial" 2>/dev/null | tr -d '\r' || true)
    if alive "$pid"; then
        stop_qemu "$pid" || true
        echo "boot.sh: guest ($accel) did not print '$READY_LINE' within ${timeout}s (serial log: $serial, last line: '$last')" >&2
    else
        echo "boot.sh: QEMU ($accel) exited before the guest was ready (serial log: $serial, last line: '$last')" >&2
    fi
    started_pid=''
    exit 1
fi
started_pid=''

echo "pid=$pid"
echo "kernel=$kernel_elf"
echo "qmp=$qmp"
echo "gdb=$gdb"
echo "serial=$serial"
echo "accel=$accel"
echo "user_dir=$user_dir"
