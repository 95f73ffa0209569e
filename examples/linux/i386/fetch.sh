#!/usr/bin/env bash
# Fetch Debian's 32-bit x86 kernel (linux-image-ABI-unsigned, flavour 686-pae) and its
# debug vmlinux (linux-image-ABI-dbg) for the i386 Linux guest, once per machine. Like
# ../fetch.sh, with two differences that keep the 64-bit guest's files apart:
#
# - apt reads i386 package lists of its own, kept in ~/.cache/qmpprof/apt/bookworm-i386
#   (APT::Architecture=i386, the host's sources and dpkg's state left out), so the host
#   needs no `dpkg --add-architecture i386`;
# - the .debs go to ~/.cache/qmpprof/debian-i386, not ~/.cache/qmpprof/debian: ../Makefile
#   and ../mkcpio.py take every linux-image-*-unsigned .deb found there for the 64-bit
#   initramfs.
#
# vmlinuz and vmlinux are extracted to ~/.cache/qmpprof/linux/ABI/ as ../fetch.sh does.
# Skips whatever is cached already.
#
#   fetch.sh [ABI]      ABI defaults to $KERNEL_ABI, else 6.1.0-50-686-pae (the ABI of the
#                       64-bit guest's 6.1.0-50-amd64); `fetch.sh latest` takes the
#                       newest 6.1 686-pae kernel the lists know
#
# Also extracts the 32-bit vDSO's debug file (vdso32.so, from the -dbg package) there.
#
# Prints on stdout: vmlinuz=<path> vmlinux=<path> vdso=<path> abi=<ABI> debs=<dir>
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

DEFAULT_ABI=6.1.0-50-686-pae
cache=${QMPPROF_CACHE:-$HOME/.cache/qmpprof}
debs=$cache/debian-i386
lists=$cache/apt/bookworm-i386
SUITES=("debian bookworm main" "debian bookworm-updates main"
        "debian-security bookworm-security main")

APT=(-o "Dir::Etc::SourceList=$lists/sources.list" -o Dir::Etc::SourceParts=/dev/null
     -o "Dir::State::Lists=$lists/lists" -o "Dir::Cache=$lists/cache"
     -o Dir::State::Status=/dev/null -o APT::Architecture=i386 -o APT::Architectures::=i386)

# update [force]: the i386 package lists, fetched once (again with force).
update() {
    update_lists i386 "$@"
}

has() {
    apt-cache "${APT[@]}" show "$1" >/dev/null 2>&1
}

# deb PACKAGE: its .deb in the cache, downloaded if missing.
deb() {
    local found pattern=$debs/$1_*_i386.deb
    found=$(compgen -G "$pattern" | head -n 1 || true)
    if [[ -z $found ]]; then
        update
        has "$1" || update force
        has "$1" || { echo "fetch.sh: Debian has no i386 package $1 (try \`fetch.sh latest\`)" >&2; exit 1; }
        echo "fetch.sh: downloading $1 into $debs" >&2
        (cd "$debs" && apt-get "${APT[@]}" download -q "$1:i386" >&2)
        found=$(compgen -G "$pattern" | head -n 1)
    fi
    echo "$found"
}

# latest: the newest 6.1 686-pae ABI the lists know (linux-image-686-pae's dependency).
latest() {
    update
    apt-cache "${APT[@]}" depends linux-image-686-pae 2>/dev/null |
        sed -n 's/^ *Depends: linux-image-\([0-9][^ ]*-686-pae\)\(:i386\)\?$/\1/p' | head -n 1
}

abi=${1:-${KERNEL_ABI:-$DEFAULT_ABI}}
if [[ $abi == latest ]]; then
    abi=$(latest)
    [[ -n $abi ]] || { echo "fetch.sh: no linux-image-686-pae in the i386 lists" >&2; exit 1; }
fi
[[ $abi =~ ^[0-9][0-9a-z.+-]*-686(-pae)?$ ]] || { echo "fetch.sh: bad i386 kernel ABI '$abi'" >&2; exit 1; }
out=$cache/linux/$abi
mkdir -p "$debs" "$out"
if [[ ! -s $out/vmlinuz ]]; then
    package=$(deb "linux-image-$abi-unsigned")
    extract "$package" "./boot/vmlinuz-$abi" "$out/vmlinuz"
fi
if [[ ! -s $out/vmlinux ]]; then
    package=$(deb "linux-image-$abi-dbg")
    extract "$package" "./usr/lib/debug/boot/vmlinux-$abi" "$out/vmlinux"
fi
# The 32-bit vDSO with its debug info (linked at 0; the guest maps it where
# AT_SYSINFO_EHDR says): __kernel_vsyscall's symbols and CFI, for GDB and qmpprof.
if [[ ! -s $out/vdso32.so ]]; then
    package=$(deb "linux-image-$abi-dbg")
    extract "$package" "./usr/lib/debug/lib/modules/$abi/vdso/vdso32.so" "$out/vdso32.so"
fi
echo "vmlinuz=$out/vmlinuz"
echo "vmlinux=$out/vmlinux"
echo "vdso=$out/vdso32.so"
echo "abi=$abi"
echo "debs=$debs"
