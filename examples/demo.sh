#!/usr/bin/env bash
# `make demo`: boot the example guest, profile it for 10 s, write demo/, print the
# hottest stacks, stop the guest. Run from the repository root with qmpprof on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}
ACCEL=${ACCEL:-auto}
out=demo
mkdir -p "$out"
rm -f "$out/qmp.sock"

echo "booting the example guest (accel=$ACCEL)..."
declare -A guest
while IFS='=' read -r key value; do
    guest[$key]=$value
done < <(examples/guest/boot.sh --qmp "$out/qmp.sock" --serial "$out/serial.log" --accel "$ACCEL")
trap 'examples/guest/boot.sh stop "${guest[pid]}"' EXIT
echo "guest running under ${guest[accel]} (QEMU pid ${guest[pid]}); profiling for $DURATION s..."

qmpprof record --qmp-socket "${guest[qmp]}" --kernel "${guest[kernel]}" \
    --duration "$DURATION" -o "$out/profile.folded"

echo
echo "folded stacks: $out/profile.folded (open it in https://www.speedscope.app or feed it to flamegraph.pl)"
