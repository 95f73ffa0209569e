# Shell functions the Linux guests' scripts share (fetch.sh and boot.sh here and in
# i386/); sourced, never run.

# extract DEB MEMBER TARGET: one file of a package, written whole or not at all. tar
# stops at the member (--occurrence): the debug vmlinux comes before thousands of
# modules, so this reads a tenth of the archive, and dpkg-deb dies of SIGPIPE.
extract() {
    echo "fetch.sh: extracting $2 from $(basename "$1")" >&2
    local status
    status=$(set +o pipefail
        dpkg-deb --fsys-tarfile "$1" 2>/dev/null | tar -xOf - --occurrence=1 "$2" >"$3.part"
        echo "${PIPESTATUS[1]}")
    [[ $status == 0 && -s $3.part ]] || { echo "fetch.sh: no $2 in $1" >&2; exit 1; }
    mv "$3.part" "$3"
}

# gdb_endpoint: boot.sh's --gdb value ($gdb: a unix socket, or a TCP port of 127.0.0.1
# if a number) as it is printed ($gdb) and as QEMU's -gdb device ($gdb_device); both
# empty without --gdb. Uses boot.sh's die.
gdb_endpoint() {
    gdb_device=''
    if [[ $gdb =~ ^[0-9]+$ ]]; then
        ((gdb > 0 && gdb < 65536)) || die "--gdb PORT must be 1..65535"
        gdb=127.0.0.1:$gdb gdb_device=tcp:$gdb,server=on,wait=off
    elif [[ -n $gdb ]]; then
        gdb=$(realpath -m -- "$gdb") gdb_device=unix:$gdb,server=on,wait=off
    fi
}

# memory_backend PATH SIZE: QEMU's arguments that keep the guest's RAM (SIZE) in the
# shared file PATH (boot.sh --memory-backend), appended to the array args.
memory_backend() {
    args+=(-object "memory-backend-file,id=mem,size=$2,mem-path=$(realpath -m -- "$1"),share=on"
           -machine memory-backend=mem)
}
