#!/usr/bin/env bash
# Fetch Debian's arm64 kernels, their debug vmlinux and arm64 libc6 for the AArch64 Linux
# guest, once per machine. Like ../i386/fetch.sh:
#
# - apt reads arm64 package lists of its own, kept in ~/.cache/qmpprof/apt/bookworm-arm64
#   (APT::Architecture=arm64, bookworm with its updates, security and backports suites;
#   the host's sources and dpkg's state left out), so the host needs no
#   `dpkg --add-architecture arm64`;
# - the .debs go to ~/.cache/qmpprof/debian-arm64 (../Makefile and ../mkcpio.py take every
#   linux-image-*-unsigned .deb in debian/ for the x86-64 initramfs), the kernels' files
#   to ~/.cache/qmpprof/linux-arm64/ABI/: vmlinuz (Debian's arm64 vmlinuz is already an
#   uncompressed Image: QEMU's -kernel boots it as is), config, and the debug vmlinux
#   from linux-image-ABI-dbg (hundreds of MB; tar stops at it, as ../fetch.sh does).
#
# Skips whatever is cached already; says one line per download. $QMPPROF_CACHE replaces
# ~/.cache/qmpprof.
#
#   fetch.sh [ABI]   ABI defaults to $KERNEL_ABI, else the first of KERNELS
#   fetch.sh --all   every kernel in KERNELS (what boot.sh --abi and the tests boot)
#   fetch.sh --list  the ABIs in KERNELS, one a line (no download)
#   fetch.sh --libc  Debian's arm64 libc6 and libc6-dbg (the host's libc6 version when the
#                    arm64 lists have it, else the newest), extracted together into
#                    ~/.cache/qmpprof/sysroot-arm64/libc6_VERSION/, laid out as the
#                    guest's root (absolute symbolic links made relative)
#
# Prints on stdout, one per line: vmlinuz=<path> vmlinux=<path> config=<path> abi=<ABI>
# per kernel; with --libc: libc=<dir> version=<V>.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

# bookworm's 6.1 (generic and cloud flavours, the ABI of the x86-64 guest's
# 6.1.0-50-amd64) and bookworm-backports' 6.12 (the same as the x86-64 guest's).
KERNELS=(6.1.0-50-arm64 6.1.0-50-cloud-arm64 6.12.95+deb12-arm64)
cache=${QMPPROF_CACHE:-$HOME/.cache/qmpprof}
debs=$cache/debian-arm64
lists=$cache/apt/bookworm-arm64
SUITES=("debian bookworm main" "debian bookworm-updates main"
        "debian-security bookworm-security main" "debian bookworm-backports main")

APT=(-o "Dir::Etc::SourceList=$lists/sources.list" -o Dir::Etc::SourceParts=/dev/null
     -o "Dir::State::Lists=$lists/lists" -o "Dir::Cache=$lists/cache"
     -o Dir::State::Status=/dev/null -o APT::Architecture=arm64 -o APT::Architectures::=arm64)
# apt's downloads into the cache run as root where we are root: its sandbox user, _apt,
# may not write there (under /root), and apt says so in a warning each time.
[[ $(id -u) != 0 ]] || APT+=(-o APT::Sandbox::User=root)

# update [force]: the arm64 package lists, fetched once (again with force).
update() {
    update_lists arm64 "$@"
}

has() {
    apt-cache "${APT[@]}" show "$1" >/dev/null 2>&1
}

# deb PACKAGE [VERSION]: its .deb in the cache, downloaded if missing.
deb() {
    local found size pattern=$debs/$1_${2:-*}_arm64.deb wanted=$1${2:+=$2}
    pattern=${pattern/:/%3a}  # an epoch, as apt names the file
    found=$(compgen -G "$pattern" | head -n 1 || true)
    if [[ -z $found ]]; then
        update
        has "$wanted" || update force
        has "$wanted" || { echo "fetch.sh: Debian has no arm64 package $wanted" >&2; exit 1; }
        size=$(apt-cache "${APT[@]}" show --no-all-versions "$wanted" 2>/dev/null |
            awk '/^Size:/ {printf "%.0f", $2 / 1e6; exit}')
        echo "fetch.sh: downloading $wanted (${size:-?} MB) into $debs..." >&2
        (cd "$debs" && apt-get "${APT[@]}" download -qq "$1:arm64${2:+=$2}" >&2)
        found=$(compgen -G "$pattern" | head -n 1)
    fi
    echo "$found"
}

# fetch ABI: one kernel's files, then its lines on stdout.
fetch() {
    local abi=$1 out=$cache/linux-arm64/$1 package
    [[ $abi =~ ^[0-9][0-9a-z.+-]*-arm64$ ]] || { echo "fetch.sh: bad arm64 kernel ABI '$abi'" >&2; exit 1; }
    mkdir -p "$debs" "$out"
    if [[ ! -s $out/vmlinuz || ! -s $out/config ]]; then
        package=$(deb "linux-image-$abi-unsigned")  # set -e: a failed download ends here
        extract "$package" "./boot/vmlinuz-$abi" "$out/vmlinuz"
        extract "$package" "./boot/config-$abi" "$out/config"
    fi
    if [[ ! -s $out/vmlinux ]]; then
        package=$(deb "linux-image-$abi-dbg")
        extract "$package" "./usr/lib/debug/boot/vmlinux-$abi" "$out/vmlinux"
    fi
    echo "vmlinuz=$out/vmlinuz"
    echo "vmlinux=$out/vmlinux"
    echo "config=$out/config"
    echo "abi=$abi"
}

# libc: libc6 and libc6-dbg of one version, extracted together (dpkg-deb -x) into the
# cache once, absolute links made relative (/lib/ld-linux-aarch64.so.1 read through on
# the host would reach the host's files, or none).
libc() {
    local versions version installed out file link
    update
    versions=$(apt-cache "${APT[@]}" madison libc6 2>/dev/null |
        awk -F'|' '{gsub(/ /, "")} $1 == "libc6" && !seen[$2]++ {print $2}')
    [[ -n $versions ]] || { echo "fetch.sh: the arm64 lists have no libc6" >&2; exit 1; }
    installed=$(dpkg-query -W -f '${Version}' libc6 2>/dev/null || true)
    if grep -qxF -- "$installed" <<<"$versions"; then
        version=$installed
    else
        version=$(head -n 1 <<<"$versions")
    fi
    out=$cache/sysroot-arm64/libc6_$version
    if [[ ! -d $out ]]; then
        rm -rf "$out.part" && mkdir -p "$out.part" "$debs"
        for package in libc6 libc6-dbg; do
            file=$(deb "$package" "$version")
            echo "fetch.sh: extracting $(basename "$file")" >&2
            dpkg-deb -x "$file" "$out.part"
        done
        find "$out.part" -type l -lname '/*' -print0 | while IFS= read -r -d '' link; do
            ln -sfn "$(realpath -ms --relative-to="${link%/*}" "$out.part$(readlink "$link")")" "$link"
        done
        mv "$out.part" "$out"
    fi
    echo "libc=$out"
    echo "version=$version"
}

case ${1:-} in
    --list) printf '%s\n' "${KERNELS[@]}" ;;
    --all) for abi in "${KERNELS[@]}"; do fetch "$abi"; done ;;
    --libc) libc ;;
    *) fetch "${1:-${KERNEL_ABI:-${KERNELS[0]}}}" ;;
esac
