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

# update_lists ARCH [force]: a foreign architecture's package lists (fetch.sh's $lists,
# $SUITES, $APT), fetched once (again with force). A suite the mirror fails to give
# (mid-sync) is left out with apt's warning; the others serve.
update_lists() {
    [[ -s $lists/lists/.updated && -z ${2:-} ]] && return 0
    echo "fetch.sh: fetching bookworm's $1 package lists into $lists" >&2
    mkdir -p "$lists/lists/partial" "$lists/cache/archives/partial"
    local suite arch=$1
    for suite in "${SUITES[@]}"; do
        set -- $suite
        echo "deb [arch=$arch signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/$1 $2 $3"
    done >"$lists/sources.list"
    apt-get "${APT[@]}" update -qq >&2 || echo "fetch.sh: apt-get update failed in part (above); going on" >&2
    date >"$lists/lists/.updated"
}

# boot_until_ready: boot.sh's loop (its $args, $serial, $qmp, $gdb, $gdb_device,
# $pidfile, $timeout, $retries, $READY_LINE, $QEMU, die): QEMU started until the serial
# log says $READY_LINE, booted again up to $retries times when the guest dies, hangs or
# Oopses first. Sets $pid, $attempt and $start.
boot_until_ready() {
    attempt=0
    while :; do
        attempt=$((attempt + 1))
        rm -f "$serial" "$qmp"
        [[ -n $gdb_device && $gdb != 127.0.0.1:* ]] && rm -f "$gdb"
        start=$SECONDS
        "$QEMU" "${args[@]}" </dev/null >/dev/null || die "QEMU failed to start"
        pid=$(tr -d ' \n' <"$pidfile")
        local deadline=$((SECONDS + timeout)) ready=1
        until grep -qF "$READY_LINE" "$serial" 2>/dev/null; do
            # panic=-1 and -no-reboot: a panic ends QEMU. An Oops that leaves the kernel
            # running shows on the console; it is not trusted either.
            if ! kill -0 "$pid" 2>/dev/null || ((SECONDS >= deadline)) ||
                grep -qE 'Kernel panic|Internal error: Oops|Oops:|BUG:' "$serial" 2>/dev/null; then
                ready=0
                break
            fi
            sleep 0.2
        done
        ((ready)) && break
        "$0" stop "$pid" >/dev/null 2>&1 || true
        echo "boot.sh: attempt $attempt: guest not ready after $((SECONDS - start))s (serial log: $serial, last line: '$(tail -n 1 "$serial" 2>/dev/null | tr -d '\r')')" >&2
        ((attempt <= retries)) || die "guest not ready in $attempt attempts"
        cp "$serial" "$serial.attempt$attempt" 2>/dev/null || true
    done
}
