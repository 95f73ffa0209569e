#!/usr/bin/env bash
# Build the stock guest once: Debian 12's own user space, from Debian's packages and
# nothing of ours but its /init (init, a bash script), as an initramfs for Debian's 6.1
# kernel (`boot.sh --initrd`). `debootstrap --variant=minbase bookworm` with python3 and
# perl (gzip, coreutils and perl-base are in minbase): every program a stripped PIE as the
# archive ships it, every library Debian's.
#
#   build.sh          # prints initrd=<the cpio> root=<its tree>
#
# Both are cached outside the work tree, as the kernels are ($QMPPROF_CACHE, else
# ~/.cache/qmpprof): stock/bookworm-minbase/ (the tree, root's: a copy of the guest's
# files, as `qmpprof --sysroot` takes them) and stock/bookworm-minbase.cpio. The tree is
# built again only when PACKAGES change, the archive only when it is older than init or
# this script. debootstrap needs root: sudo when not root. Everything but the two paths
# goes to stderr.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SUITE=bookworm
MIRROR=${QMPPROF_DEBIAN_MIRROR:-http://deb.debian.org/debian}
#: Beyond minbase (which has coreutils, gzip, perl-base and bash).
PACKAGES=python3,perl
#: What the guest never reads: documentation, manuals, translations, apt's caches. The
#: initramfs is unpacked into the guest's RAM, and every byte of it is inflated and
#: copied under TCG.
TRIM=(usr/share/doc usr/share/man usr/share/info usr/share/locale usr/share/lintian
      usr/share/common-licenses var/cache/apt var/cache/debconf var/lib/apt/lists
      var/log)
SUDO=$([[ $(id -u) == 0 ]] || echo sudo)

die() {
    echo "build.sh: $*" >&2
    exit 1
}

cache=${QMPPROF_CACHE:-$HOME/.cache/qmpprof}/stock
root=$cache/$SUITE-minbase
initrd=$root.cpio
mkdir -p "$cache"
exec 9>"$cache/.build.lock"  # several boot.sh or make may run at once: one build
flock 9

# The tree: what debootstrap wrote, less TRIM. A stamp in it says which packages it has.
stamp=$root/.qmpprof-stock
if [[ ! -f $stamp || $(cat "$stamp") != "$SUITE $PACKAGES" ]]; then
    [[ -x /usr/sbin/debootstrap ]] || die "no debootstrap: run make system-deps (or apt-get install debootstrap)"
    echo "build.sh: debootstrap --variant=minbase $SUITE with $PACKAGES into $root (about a minute)" >&2
    $SUDO rm -rf "$root.tmp" "$initrd"
    $SUDO /usr/sbin/debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root.tmp" "$MIRROR" >&2 ||
        die "debootstrap failed (its log: $root.tmp/debootstrap/debootstrap.log)"
    for path in "${TRIM[@]}"; do
        $SUDO rm -rf "${root:?}.tmp/$path"
    done
    echo "$SUITE $PACKAGES" | $SUDO tee "$root.tmp/.qmpprof-stock" >/dev/null
    $SUDO rm -rf "$root"
    $SUDO mv "$root.tmp" "$root"
fi

# The archive: the tree with /init, uncompressed (the kernel inflating gzip under TCG
# takes longer than reading the bytes: README.md). bsdtar writes newc with the tree's
# owners, modes, device nodes (/dev/console, which the kernel opens for /init before
# anything is mounted) and hard links; names without "./", parents first.
if [[ ! $initrd -nt $HERE/init || ! $initrd -nt ${BASH_SOURCE[0]} ]]; then
    echo "build.sh: packing $root into $initrd" >&2
    $SUDO install -m 755 "$HERE/init" "$root/init"
    (cd "$root" && $SUDO find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort |
        $SUDO bsdtar --format newc -cnf - -T -) >"$initrd.tmp"
    mv "$initrd.tmp" "$initrd"
fi

echo "initrd=$initrd"
echo "root=$root"
