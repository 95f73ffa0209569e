#!/usr/bin/env bash
# Fetch Debian's kernel and its debug vmlinux for the Linux example guest, once per
# machine: `apt-get download` into ~/.cache/qmpprof/debian ($QMPPROF_CACHE/debian), the
# two files extracted to ~/.cache/qmpprof/linux/ABI/{vmlinuz,vmlinux}. Skips whatever is
# cached already; says one line per download (`fetch.sh: downloading PACKAGE (N MB)...`).
#
#   fetch.sh [ABI]     ABI defaults to $KERNEL_ABI, else the first of KERNELS (bookworm)
#   fetch.sh --all     every kernel in KERNELS (the ones the tests boot)
#   fetch.sh --list [RELEASE]
#                      the ABIs in KERNELS, one a line (with RELEASE, bullseye, its only)
#   fetch.sh --libc [ABI]
#                      Debian's libc6 and libc6-dbg for the guest's user space, extracted
#                      to ~/.cache/qmpprof/sysroot/libc6_VERSION/ (VERSION: the host's
#                      libc6 if the archive still has it, else apt's candidate), and a
#                      second version the archive offers (the tests' wrong libc), if any.
#                      With an ABI of the older release: that release's newest libc6
#                      (its guests run their own release's user space), no second one,
#                      and libc6-dev's tree to build our programs against it
#   fetch.sh --demo [ABI], fetch.sh --demo --libc [ABI]
#                      only what `make demo` boots (it profiles with no kernel file and
#                      no debug files): the kernel's vmlinuz, no -dbg package (vmlinux=
#                      says the debug vmlinux only if it is cached already); libc6 alone,
#                      in ~/.cache/qmpprof/sysroot/libc6-nodbg_VERSION/, no libc6-dbg and
#                      no second version (the older release's libc6-dev tree still: its
#                      programs are built against it)
#
# A kernel only bookworm-backports has (6.12) makes it add that archive to apt's sources
# once (NotAutomatic there: `apt-get upgrade` still takes nothing from it). One of an older
# release (bullseye's 5.10) is found through package lists of that release kept in the
# cache (~/.cache/qmpprof/apt/bullseye): the host's apt sources never name it.
# Prints, one per line on stdout: vmlinuz=<path> vmlinux=<path> abi=<ABI> release=<R> per
# kernel (R: the older release whose user space its guest runs, bullseye, or empty for the
# host's: the flavour of examples/linux/build/ that boot.sh boots);
# with --libc: libc=<dir> version=<V> other_libc=<dir or empty> other_version=<V or empty>,
# and for the older release dev=<dir> (libc6-dev's tree: gcc --sysroot=<dir>).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# The kernels the tests boot: bookworm's own 6.1, bookworm-backports' 6.12 and
# bullseye's 5.10 (the last of Debian 11's kernels the package registry serves).
KERNELS=(6.1.0-50-amd64 6.12.95+deb12-amd64 5.10.0-46-amd64)
# The release an older kernel comes from: its ABI's prefix, its suites.
OLD_RELEASE_ABI=5.10.0-
OLD_RELEASE=bullseye
OLD_SUITES=("debian $OLD_RELEASE main" "debian-security $OLD_RELEASE-security main")
cache=${QMPPROF_CACHE:-$HOME/.cache/qmpprof}
debs=$cache/debian
SUDO=$([[ $(id -u) == 0 ]] || echo sudo)
DEMO=''  # --demo: no debug packages, no second libc
# apt's downloads into the cache run as root where we are root: its sandbox user, _apt,
# may not write there (under /root), and apt says so in a warning each time.
SANDBOX=()
[[ $(id -u) != 0 ]] || SANDBOX=(-o APT::Sandbox::User=root)

# release ABI: OLD_RELEASE if kernel ABI is that release's, else nothing (the host's).
release() {
    [[ $1 != "$OLD_RELEASE_ABI"* ]] || echo "$OLD_RELEASE"
}

# has PACKAGE: apt's lists know PACKAGE.
has() {
    apt-cache show "$1" >/dev/null 2>&1
}

# add_backports: this release's backports archive in apt's sources, unless already there.
add_backports() {
    local codename
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    [[ -n $codename ]] || return 0
    apt-cache policy | grep -qF "n=$codename-backports," && return 0
    echo "fetch.sh: adding $codename-backports to apt's sources" >&2
    printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' \
        "Suites: $codename-backports" 'Components: main' \
        'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' |
        $SUDO tee "/etc/apt/sources.list.d/qmpprof-$codename-backports.sources" >/dev/null
    $SUDO apt-get update -qq >&2
}

# release_apt: APT, apt's options for the package lists to use: none (the host's) unless
# OLD=1, then OLD_RELEASE's alone, kept in the cache and updated once (the host's sources
# and dpkg's state stay out of it).
APT=()
release_apt() {
    APT=()
    [[ ${OLD:-} == 1 ]] || return 0
    local dir=$cache/apt/$OLD_RELEASE suite
    APT=(-o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
         -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache"
         -o Dir::State::Status=/dev/null)
    [[ -s $dir/lists/.updated ]] && return 0
    echo "fetch.sh: fetching $OLD_RELEASE's package lists into $dir" >&2
    mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
    for suite in "${OLD_SUITES[@]}"; do
        set -- $suite
        echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/$1 $2 $3"
    done >"$dir/sources.list"
    apt-get "${APT[@]}" "${SANDBOX[@]}" update -qq >&2
    date >"$dir/lists/.updated"
}

# deb PACKAGE [VERSION]: the path of PACKAGE's .deb in the cache, downloaded if missing;
# from OLD_RELEASE's lists when OLD=1.
deb() {
    local found size pattern=$debs/$1_${2:+${2/:/%3a}_}*.deb wanted=$1${2:+=$2}
    found=$(compgen -G "$pattern" | head -n 1 || true)
    if [[ -z $found ]]; then
        release_apt
        if [[ ${OLD:-} != 1 ]] && ! has "$1"; then
            echo "fetch.sh: updating the package lists to find $1" >&2
            $SUDO apt-get update -qq >&2
            has "$1" || add_backports
        fi
        apt-cache "${APT[@]}" show "$wanted" >/dev/null 2>&1 ||
            { echo "fetch.sh: Debian has no package $wanted (try KERNEL_ABI=... of a current kernel)" >&2; exit 1; }
        size=$(apt-cache "${APT[@]}" show --no-all-versions "$wanted" 2>/dev/null |
            awk '/^Size:/ {printf "%.0f", $2 / 1e6; exit}')
        echo "fetch.sh: downloading $wanted (${size:-?} MB)..." >&2
        (cd "$debs" && apt-get "${APT[@]}" "${SANDBOX[@]}" download -qq "$wanted" >&2)
        found=$(compgen -G "$pattern" | head -n 1)
    fi
    echo "$found"
}

# fetch ABI: both files of one kernel, then its three lines on stdout.
fetch() {
    local abi=$1 out=$cache/linux/$1 package
    [[ $abi =~ ^[0-9][0-9a-z.+-]*$ ]] || { echo "fetch.sh: bad kernel ABI '$abi'" >&2; exit 1; }
    mkdir -p "$debs" "$out"
    local OLD=''  # seen by deb(): the kernel of an older release
    [[ -z $(release "$abi") ]] || OLD=1
    if [[ ! -s $out/vmlinuz ]]; then
        package=$(deb "linux-image-$abi-unsigned")  # set -e: a failed download ends here
        extract "$package" "./boot/vmlinuz-$abi" "$out/vmlinuz"
    fi
    if [[ ! -s $out/vmlinux && -z $DEMO ]]; then
        package=$(deb "linux-image-$abi-dbg")
        extract "$package" "./usr/lib/debug/boot/vmlinux-$abi" "$out/vmlinux"
    fi
    echo "vmlinuz=$out/vmlinuz"
    echo "vmlinux=$([[ ! -s $out/vmlinux ]] || echo "$out/vmlinux")"
    echo "abi=$abi"
    echo "release=$(release "$abi")"
}

# versions PACKAGE: every version of PACKAGE apt's lists know (OLD_RELEASE's when OLD=1),
# newest first, each once (madison says one a suite).
versions() {
    release_apt
    apt-cache "${APT[@]}" madison "$1" 2>/dev/null |
        awk -F'|' -v name="$1" '{gsub(/ /, "")} $1 == name && !seen[$2]++ {print $2}'
}

# package_tree NAME PACKAGE=VERSION...: the packages, downloaded into the cache once and
# extracted together (dpkg-deb -x) into ~/.cache/qmpprof/sysroot/NAME, laid out as the
# guest's root.
# Absolute symbolic links are made relative (bullseye's /lib64/ld-linux-x86-64.so.2 ->
# /lib/x86_64-linux-gnu/ld-2.31.so): read through on the host, they would reach the
# host's own files, or none.
package_tree() {
    local out=$cache/sysroot/$1 spec file link target; shift
    if [[ ! -d $out ]]; then
        mkdir -p "$debs" "$cache/sysroot"
        rm -rf "$out.part" && mkdir "$out.part"
        for spec in "$@"; do
            file=$(deb "${spec%%=*}" "${spec#*=}")
            echo "fetch.sh: extracting $(basename "$file")" >&2
            dpkg-deb -x "$file" "$out.part"
        done
        find "$out.part" -type l -lname '/*' -print0 | while IFS= read -r -d '' link; do
            target=$out.part$(readlink "$link")
            ln -sfn "$(realpath -ms --relative-to="${link%/*}" "$target")" "$link"
        done
        mv "$out.part" "$out"
    fi
    echo "$out"
}

# libc_tree VERSION: libc6 and libc6-dbg of VERSION: the guest's files, their debug files
# (with --demo libc6 alone, in a tree of its own: the tests' always has the debug files).
libc_tree() {
    if [[ -n $DEMO ]]; then
        package_tree "libc6-nodbg_$1" "libc6=$1"
    else
        package_tree "libc6_$1" "libc6=$1" "libc6-dbg=$1"
    fi
}

# libc: the guest's libc (the host's version when the archive has it) and another one.
libc() {
    local installed versions version other=''
    versions=$(versions libc6)
    if [[ -z $versions ]]; then
        echo "fetch.sh: updating the package lists to find libc6" >&2
        $SUDO apt-get update -qq >&2
        versions=$(versions libc6)
    fi
    [[ -n $versions ]] || { echo "fetch.sh: apt knows no libc6 package" >&2; exit 1; }
    installed=$(dpkg-query -W -f '${Version}' libc6 2>/dev/null || true)
    if grep -qxF -- "$installed" <<<"$versions"; then
        version=$installed
    else
        version=$(head -n 1 <<<"$versions")
    fi
    [[ -n $DEMO ]] || other=$(grep -vxF -- "$version" <<<"$versions" | head -n 1 || true)
    local tree other_tree=''  # assigned apart from `local`: set -e sees a failed download
    tree=$(libc_tree "$version")
    [[ -z $other ]] || other_tree=$(libc_tree "$other")
    echo "libc=$tree"
    echo "version=$version"
    echo "other_libc=$other_tree"
    echo "other_version=$other"
}

# old_libc: OLD_RELEASE's newest libc6 for its guests, through its own lists, and the tree
# our dynamically linked files are built against for them (dev=): built against the host's
# newer glibc they would need its symbol versions (GLIBC_2.34), which the guest's libc
# lacks. No second version: the wrong-libc tests boot the host release's kernel.
old_libc() {
    local OLD=1 version headers tree dev  # OLD: seen by versions() and deb()
    version=$(versions libc6 | head -n 1)
    headers=$(versions linux-libc-dev | head -n 1)  # glibc's headers include <linux/*.h>
    [[ -n $version && -n $headers ]] ||
        { echo "fetch.sh: $OLD_RELEASE's lists have no libc6 or linux-libc-dev" >&2; exit 1; }
    tree=$(libc_tree "$version")
    dev=$(package_tree "libc6-dev_$version" "libc6=$version" "libc6-dev=$version" \
        "linux-libc-dev=$headers")
    echo "libc=$tree"
    echo "version=$version"
    echo "other_libc="
    echo "other_version="
    echo "dev=$dev"
}

arguments=()
for argument in "$@"; do
    if [[ $argument == --demo ]]; then DEMO=1; else arguments+=("$argument"); fi
done
set -- ${arguments[@]+"${arguments[@]}"}
case ${1:-} in
    --libc) if [[ -n $(release "${2:-}") ]]; then old_libc; else libc; fi ;;
    --list) for abi in "${KERNELS[@]}"; do
                [[ -n ${2:-} && $(release "$abi") != "$2" ]] || echo "$abi"
            done ;;
    --all) for abi in "${KERNELS[@]}"; do fetch "$abi"; done ;;
    *) fetch "${1:-${KERNEL_ABI:-${KERNELS[0]}}}" ;;
esac
