#!/usr/bin/env bash
# Fetch Debian's kernel and its debug vmlinux for the Linux example guest, once per
# machine: `apt-get download` into ~/.cache/qmpprof/debian, the two files extracted to
# ~/.cache/qmpprof/linux/ABI/{vmlinuz,vmlinux}. Skips whatever is cached already.
#
#   fetch.sh [ABI]        ABI defaults to $KERNEL_ABI, else 6.1.0-50-amd64 (bookworm)
#
# Prints, one per line on stdout: vmlinuz=<path> vmlinux=<path> abi=<ABI>
set -euo pipefail

abi=${1:-${KERNEL_ABI:-6.1.0-50-amd64}}
[[ $abi =~ ^[0-9][0-9a-z.+-]*$ ]] || { echo "fetch.sh: bad kernel ABI '$abi'" >&2; exit 1; }
cache=${QMPPROF_CACHE:-$HOME/.cache/qmpprof}
debs=$cache/debian
out=$cache/linux/$abi
SUDO=$([[ $(id -u) == 0 ]] || echo sudo)

# deb PACKAGE: the path of PACKAGE's .deb in the cache, downloaded if missing.
deb() {
    local found
    found=$(compgen -G "$debs/$1_*.deb" | head -n 1 || true)
    if [[ -z $found ]]; then
        if ! apt-cache show "$1" >/dev/null 2>&1; then
            echo "fetch.sh: updating the package lists to find $1" >&2
            $SUDO apt-get update -qq >&2
        fi
        apt-cache show "$1" >/dev/null 2>&1 ||
            { echo "fetch.sh: Debian has no package $1 (try KERNEL_ABI=... of a current kernel)" >&2; exit 1; }
        echo "fetch.sh: downloading $1 into $debs" >&2
        (cd "$debs" && apt-get download -q "$1" >&2)
        found=$(compgen -G "$debs/$1_*.deb" | head -n 1)
    fi
    echo "$found"
}

# extract DEB MEMBER TARGET: one file of a package, written whole or not at all.
extract() {
    echo "fetch.sh: extracting $2 from $(basename "$1")" >&2
    dpkg-deb --fsys-tarfile "$1" | tar -xOf - "$2" >"$3.part"
    mv "$3.part" "$3"
}

mkdir -p "$debs" "$out"
if [[ ! -s $out/vmlinuz ]]; then
    package=$(deb "linux-image-$abi-unsigned")  # set -e: a failed download ends here
    extract "$package" "./boot/vmlinuz-$abi" "$out/vmlinuz"
fi
if [[ ! -s $out/vmlinux ]]; then
    package=$(deb "linux-image-$abi-dbg")
    extract "$package" "./usr/lib/debug/boot/vmlinux-$abi" "$out/vmlinux"
fi
echo "vmlinuz=$out/vmlinuz"
echo "vmlinux=$out/vmlinux"
echo "abi=$abi"
