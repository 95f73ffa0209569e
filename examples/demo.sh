#!/usr/bin/env bash
# `make demo`: boot the example guest, profile it for 10 s, write demo/ (folded stacks and
# an SVG flame graph), print the hottest stacks, stop the guest. Run from the repository
# root with qmpprof on PATH. WORKLOAD=user profiles the guest's processes on two vCPUs.
# GUEST=linux boots Debian's kernel (examples/linux, KASLR on, 2 vCPUs; KERNEL_ABI picks
# the kernel) with its workloads instead, and profiles kernel and user space together
# with no kernel file and no sysroot: the kernel is read from the guest's memory, libc
# from its processes' (only the example's own programs are given, with --user). So it
# fetches no debug file either (boot.sh --demo): the kernel's image and libc6, ~75 MB
# once into ~/.cache/qmpprof ($QMPPROF_CACHE), not the tests' -dbg packages.
# ARCH=i386 boots the 32-bit build of the example guest instead (protected mode, PAGING=2level
# or pae) with its processes on two vCPUs (WORKLOAD=user unless given); ARCH=aarch64 its
# AArch64 build (qemu-system-aarch64 -M virt, signed return addresses), likewise.
# GUEST=linux ARCH=aarch64 boots Debian's arm64 kernel (examples/linux/aarch64, the 6.1
# cloud flavour unless KERNEL_ABI says, with its -dbg package: ~300 MB once) and profiles
# it with no file at all.
# DURATION (seconds, 10) and DEMO_OUT (the output directory, demo) change the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}
ACCEL=${ACCEL:-auto}
ARCH=${ARCH:-x86_64}
PAGING=${PAGING:-2level}
if [[ $ARCH == x86_64 ]]; then WORKLOAD=${WORKLOAD:-kernel}; else WORKLOAD=${WORKLOAD:-user}; fi
GUEST=${GUEST:-example}
out=${DEMO_OUT:-demo}
mkdir -p "$out"
rm -f "$out/qmp.sock"

if [[ $GUEST == linux && $ARCH == aarch64 ]]; then
    here=examples/linux/aarch64
    abi=${KERNEL_ABI:-6.1.0-50-cloud-arm64}
    echo "fetching Debian's arm64 kernel $abi and libc6 once (~300 MB), building the guest..."
    bash "$here/fetch.sh" "$abi" >/dev/null
    make -s -C "$here"
    echo "booting it under qemu-system-aarch64 -M virt (TCG, KASLR on, 2 vCPUs)..."
    declare -A linux
    while IFS='=' read -r key value; do
        linux[$key]=$value
    done < <("$here/boot.sh" --qmp "$out/qmp.sock" --serial "$out/serial.log" --abi "$abi" \
                 --workloads crunch,sysloop,pinned,dynwork)
    trap '"$here/boot.sh" stop "${linux[pid]}"' EXIT
    echo "guest running (QEMU pid ${linux[pid]}); profiling for $DURATION s with no file at all:"
    echo "the kernel, its tasks, the programs and libc are read from the guest's memory..."
    qmpprof record --qmp-socket "${linux[qmp]}" --duration "$DURATION" \
        -o "$out/profile.folded" -o "$out/flamegraph.svg"
    echo
    echo "open $out/flamegraph.svg in a browser; $out/profile.folded works with speedscope,"
    echo "flamegraph.pl and inferno."
    exit 0
fi

if [[ $GUEST == linux ]]; then
    echo "booting Debian's kernel with the Linux example guest's workloads (TCG)..."
    declare -A linux
    while IFS='=' read -r key value; do
        linux[$key]=$value
    done < <(examples/linux/boot.sh --demo --qmp "$out/qmp.sock" --serial "$out/serial.log" \
                 --smp 2 --workloads crunch,sysloop,pinned,dynwork ${KERNEL_ABI:+--abi "$KERNEL_ABI"})
    trap 'examples/linux/boot.sh stop "${linux[pid]}"' EXIT
    echo "guest running (QEMU pid ${linux[pid]}); profiling for $DURATION s with no kernel file"
    echo "and no sysroot: the kernel's symbols, ORC and BTF come from the guest's memory..."
    users=()
    # The dynamically linked programs are built per release (a 5.10 guest's against its
    # own libc, in build/bullseye/demo/): the flavour is where the guest's sysroot is.
    flavour=$(dirname "${linux[sysroot]}")
    for workload in examples/linux/workloads/*.c; do
        name=$(basename "$workload" .c)
        program=examples/linux/build/$name
        [[ -x $flavour/$name ]] && program=$flavour/$name
        # Programs only (qmpwork.c is libqmpwork.so.1's source: read from the guest, as libc).
        [[ -x $program ]] && users+=(--user "$program")
        [[ $name == crunch ]] && users+=(--user examples/linux/build/crunchnofp)
    done
    qmpprof record --qmp-socket "${linux[qmp]}" "${users[@]}" --duration "$DURATION" \
        -o "$out/profile.folded" -o "$out/flamegraph.svg"
    echo
    echo "open $out/flamegraph.svg in a browser; $out/profile.folded works with speedscope,"
    echo "flamegraph.pl and inferno."
    exit 0
fi

# Guest RAM in a shared file: qmpprof maps it and reads stacks without asking QEMU.
ram=/dev/shm/qmpprof-demo-$$.ram
boot=(--qmp "$out/qmp.sock" --serial "$out/serial.log" --accel "$ACCEL" --workload "$WORKLOAD"
      --memory-backend "$ram")
[[ $WORKLOAD == user ]] && boot+=(--smp 2)
[[ $ARCH == i386 ]] && boot+=(--arch i386 --paging "$PAGING")
[[ $ARCH == aarch64 ]] && boot+=(--arch aarch64)
trap 'rm -f "$ram"' EXIT
echo "booting the example guest (arch=$ARCH, accel=$ACCEL, workload=$WORKLOAD)..."
declare -A guest
while IFS='=' read -r key value; do
    guest[$key]=$value
done < <(examples/guest/boot.sh "${boot[@]}")
trap 'examples/guest/boot.sh stop "${guest[pid]}"; rm -f "$ram"' EXIT
echo "guest running under ${guest[accel]} (QEMU pid ${guest[pid]}); profiling for $DURATION s..."

qmpprof record --qmp-socket "${guest[qmp]}" --kernel "${guest[kernel]}" \
    --user-dir "${guest[user_dir]}" --mem-path "$ram" --duration "$DURATION" \
    -o "$out/profile.folded" -o "$out/flamegraph.svg"

echo
echo "open $out/flamegraph.svg in a browser; $out/profile.folded works with speedscope,"
echo "flamegraph.pl and inferno."
