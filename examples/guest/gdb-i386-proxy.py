#!/usr/bin/env python3
"""GDB remote-protocol bridge: debug the i386 guest under qemu-system-x86_64.

qemu-system-x86_64's gdbstub always describes an x86-64 CPU (target
description i386:x86-64, 64-bit registers in the 'g' packet), also while the
guest runs in 32-bit protected mode, and GDB 13 then refuses
`set architecture i386` ("Remote 'g' packet reply is too long"). Without it,
GDB would read the i386 kernel's DWARF register numbers as x86-64 ones. This
bridge sits between GDB and QEMU's gdbstub and presents the 32-bit CPU that
qemu-system-i386 presents: its target description (architecture i386,
i386-32bit.xml), 'g'/'G'/'p'/'P' in its 32-bit register layout (the low
halves of QEMU's 64-bit registers). Everything else (memory, breakpoints,
threads = vCPUs, continue, detach) passes through unchanged. Behind
qemu-system-i386 (or any stub whose architecture is not i386:x86-64) it
passes everything through.

GDB runs it as a pipe (stdin/stdout are the GDB side):

    gdb -ex 'set architecture i386' -ex 'file build/i386-fp/kernel.elf' \
        -ex 'target remote | ./gdb-i386-proxy.py /tmp/vm/gdb.sock' -ex bt -ex detach

It ends when GDB closes the pipe (as with a direct connection, the VM keeps
running only if GDB detached). Standard library only.
"""
import os
import re
import select
import socket
import sys
from collections import deque

# QEMU's i386-32bit.xml register order -> index in its i386-64bit.xml, with sizes.
#   i386:  eax ecx edx ebx esp ebp esi edi eip eflags cs ss ds es fs gs
#          fs_base gs_base k_gs_base cr0 cr2 cr3 cr4 cr8 efer st0-7
#          fctrl fstat ftag fiseg fioff foseg fooff fop xmm0-7 mxcsr
#   x86-64: rax rbx rcx rdx rsi rdi rbp rsp r8-r15 rip eflags cs ss ds es fs gs
#          fs_base gs_base k_gs_base cr0 cr2 cr3 cr4 cr8 efer st0-7
#          fctrl..fop xmm0-15 mxcsr
SIZES64 = [8] * 16 + [8, 4] + [4] * 6 + [8] * 3 + [8] * 6 + [10] * 8 + [4] * 8 + [16] * 16 + [4]
SIZES32 = [4] * 8 + [4, 4] + [4] * 6 + [4] * 3 + [4] * 6 + [10] * 8 + [4] * 8 + [16] * 8 + [4]
MAP32TO64 = ([0, 2, 3, 1, 7, 6, 4, 5, 16, 17] + list(range(18, 24)) + list(range(24, 27))
             + list(range(27, 33)) + list(range(33, 41)) + list(range(41, 49))
             + list(range(49, 57)) + [65])
OFFS64 = [sum(SIZES64[:i]) for i in range(len(SIZES64))]
assert len(SIZES32) == len(MAP32TO64) == 50 and sum(SIZES64) == 608 and sum(SIZES32) == 344

TARGET_XML = ('<?xml version="1.0"?><!DOCTYPE target SYSTEM "gdb-target.dtd">'
              '<target><architecture>i386</architecture>'
              '<xi:include href="i386-32bit.xml"/></target>')

EFLAGS_FIELDS = [("", 22, 31), ("ID", 21, 21), ("VIP", 20, 20), ("VIF", 19, 19),
                 ("AC", 18, 18), ("VM", 17, 17), ("RF", 16, 16), ("", 15, 15),
                 ("NT", 14, 14), ("IOPL", 12, 13), ("OF", 11, 11), ("DF", 10, 10),
                 ("IF", 9, 9), ("TF", 8, 8), ("SF", 7, 7), ("ZF", 6, 6), ("", 5, 5),
                 ("AF", 4, 4), ("", 3, 3), ("PF", 2, 2), ("", 1, 1), ("CF", 0, 0)]


def _feature_xml():
    """The org.gnu.gdb.i386.core feature of qemu-system-i386, registers only
    (GDB's own register types; the flags types are reduced to eflags)."""
    r = ['<?xml version="1.0"?><!DOCTYPE feature SYSTEM "gdb-target.dtd">'
         '<feature name="org.gnu.gdb.i386.core"><flags id="i386_eflags" size="4">']
    r += ['<field name="%s" start="%d" end="%d"/>' % f for f in EFLAGS_FIELDS]
    r.append('</flags>')
    regs = [("eax", 32, "int32"), ("ecx", 32, "int32"), ("edx", 32, "int32"),
            ("ebx", 32, "int32"), ("esp", 32, "data_ptr"), ("ebp", 32, "data_ptr"),
            ("esi", 32, "int32"), ("edi", 32, "int32"), ("eip", 32, "code_ptr"),
            ("eflags", 32, "i386_eflags")]
    regs += [(n, 32, "int32") for n in ("cs", "ss", "ds", "es", "fs", "gs",
                                        "fs_base", "gs_base", "k_gs_base",
                                        "cr0", "cr2", "cr3", "cr4", "cr8", "efer")]
    regs += [("st%d" % i, 80, "i387_ext") for i in range(8)]
    regs += [(n, 32, "int") for n in ("fctrl", "fstat", "ftag", "fiseg", "fioff",
                                      "foseg", "fooff", "fop")]
    regs += [("xmm%d" % i, 128, "vec128") for i in range(8)]
    regs += [("mxcsr", 32, "int")]
    r.append('<vector id="v4f" type="ieee_single" count="4"/>'
             '<vector id="v2d" type="ieee_double" count="2"/>'
             '<vector id="v16i8" type="int8" count="16"/>'
             '<vector id="v8i16" type="int16" count="8"/>'
             '<vector id="v4i32" type="int32" count="4"/>'
             '<vector id="v2i64" type="int64" count="2"/>'
             '<union id="vec128"><field name="v4_float" type="v4f"/>'
             '<field name="v2_double" type="v2d"/><field name="v16_int8" type="v16i8"/>'
             '<field name="v8_int16" type="v8i16"/><field name="v4_int32" type="v4i32"/>'
             '<field name="v2_int64" type="v2i64"/><field name="uint128" type="uint128"/>'
             '</union>')
    for i, (name, bits, typ) in enumerate(regs):
        group = ' group="float"' if name in ("fctrl", "fstat", "ftag", "fiseg", "fioff",
                                              "foseg", "fooff", "fop") else ""
        group = ' group="vector"' if name == "mxcsr" else group
        regnum = ' regnum="0"' if i == 0 else ""
        r.append('<reg name="%s" bitsize="%d" type="%s"%s%s/>' % (name, bits, typ, regnum, group))
    r.append('</feature>')
    assert len(regs) == 50
    return "".join(r)


FEATURES = {"target.xml": TARGET_XML, "i386-32bit.xml": _feature_xml()}


# Requests whose reply is a stop reply (T/S/W/X...): resume, '?', attach.
STOP_REQUEST = re.compile(r"\?|[cCsS].*|vCont;.*|vAttach;.*|vRun;.*|vStopped")


def is_stop_reply(p):
    return re.match(r"[TSWX][0-9a-fA-F]{2}", p) is not None


def frame(payload):
    data = payload.encode("latin1")
    return b"$" + data + b"#%02x" % (sum(data) & 0xFF)


class Reader:
    """Splits a byte stream into RSP items: ('pkt', payload), ('int', None)."""

    def __init__(self):
        self.buf = b""

    def feed(self, data):
        self.buf += data
        out = []
        while self.buf:
            c = self.buf[:1]
            if c in (b"+", b"-"):           # acks: the bridge acks by itself
                self.buf = self.buf[1:]
            elif c == b"\x03":
                out.append(("int", None))
                self.buf = self.buf[1:]
            elif c == b"$":
                end = self.buf.find(b"#")
                if end < 0 or len(self.buf) < end + 3:
                    break
                out.append(("pkt", self.buf[1:end].decode("latin1")))
                self.buf = self.buf[end + 3:]
            else:                           # noise before a packet
                self.buf = self.buf[1:]
        return out


class Bridge:
    def __init__(self, sock_path):
        self.q = socket.socket(socket.AF_UNIX)
        self.q.connect(sock_path)
        self.qr = Reader()
        self.gin = sys.stdin.buffer.raw if hasattr(sys.stdin.buffer, "raw") else sys.stdin.buffer
        self.gout = sys.stdout.buffer
        self.gr = Reader()
        self.pending = deque()              # handlers for QEMU's next replies
        self.translate = None               # decided at GDB's first packet (probe)

    # -- QEMU side, synchronous (only before GDB talks, and for 'G') --
    def qemu_request(self, payload):
        """Send one packet, return QEMU's reply (stray stop replies skipped)."""
        self.q.sendall(frame(payload))
        while True:
            data = self.q.recv(65536)
            if not data:
                raise EOFError("QEMU closed the gdbstub connection")
            items = self.qr.feed(data)
            for i, (kind, p) in enumerate(items):
                if kind == "pkt":
                    self.q.sendall(b"+")
                    if is_stop_reply(p):
                        continue
                    assert all(k != "pkt" for k, _ in items[i + 1:]), "unexpected extra reply"
                    return p

    def probe(self):
        """Translate only if the stub describes an x86-64 CPU."""
        reply = self.qemu_request("qXfer:features:read:target.xml:0,ffb")
        return "i386:x86-64" in reply

    # -- to GDB --
    def to_gdb(self, payload):
        self.gout.write(frame(payload))
        self.gout.flush()

    def to_qemu(self, payload, handler=None):
        """Forward a request; handler(reply) (default: reply to GDB as is)."""
        expects_stop = STOP_REQUEST.fullmatch(payload) is not None
        self.pending.append((expects_stop, handler or self.to_gdb))
        self.q.sendall(frame(payload))

    # -- conversions --
    @staticmethod
    def g64_to_32(hexdata):
        if len(hexdata) < 2 * sum(SIZES64):
            return hexdata                  # an error reply ("E..") or unexpected: as is
        out = []
        for i, j in enumerate(MAP32TO64):
            start = 2 * OFFS64[j]
            out.append(hexdata[start:start + 2 * SIZES32[i]])   # little endian: low bytes first
        return "".join(out)

    @staticmethod
    def strip_stop_regs(p):
        """Stop replies may carry register values ("NN:value;"), in 64-bit numbering: drop them."""
        if p[:1] != "T":
            return p
        fields = p[3:].split(";")
        keep = [f for f in fields if not re.fullmatch(r"[0-9a-fA-F]+:[0-9a-fA-Fx]*", f)]
        return p[:3] + ";".join(keep)

    def handle_gdb_packet(self, p):
        if self.translate is None:
            # Probe only now: GDB's packet is acked already, so a slow reply
            # here cannot make GDB retransmit it.
            self.translate = self.probe()
        if not self.translate:
            self.to_qemu(p)
            return
        m = re.fullmatch(r"qXfer:features:read:([^:]+):([0-9a-fA-F]+),([0-9a-fA-F]+)", p)
        if m:
            doc = FEATURES.get(m.group(1))
            if doc is None:
                self.to_gdb("E00")
                return
            off, length = int(m.group(2), 16), int(m.group(3), 16)
            chunk = doc[off:off + length]
            self.to_gdb(("l" if off + length >= len(doc) else "m") + chunk)
            return
        if p == "g":
            self.to_qemu("g", lambda r: self.to_gdb(self.g64_to_32(r)))
            return
        m = re.fullmatch(r"p([0-9a-fA-F]+)", p)
        if m:
            n = int(m.group(1), 16)
            if n >= len(MAP32TO64):
                self.to_gdb("E00")
                return
            size = SIZES32[n]
            self.to_qemu("p%x" % MAP32TO64[n],
                         lambda r, size=size: self.to_gdb(r if r.startswith("E") else r[:2 * size]))
            return
        m = re.fullmatch(r"P([0-9a-fA-F]+)=([0-9a-fA-F]*)", p)
        if m:
            n = int(m.group(1), 16)
            if n >= len(MAP32TO64):
                self.to_gdb("E00")
                return
            j = MAP32TO64[n]
            val = m.group(2)[:2 * SIZES32[n]].ljust(2 * SIZES64[j], "0")
            self.to_qemu("P%x=%s" % (j, val), self.to_gdb)
            return
        if p.startswith("G"):
            regs32 = p[1:]
            current = self.qemu_request_async_safe("g")
            if current is None or len(current) < 2 * sum(SIZES64):
                self.to_gdb("E01")
                return
            new = list(current)
            off32 = 0
            for i, j in enumerate(MAP32TO64):
                val = regs32[2 * off32:2 * (off32 + SIZES32[i])]
                off32 += SIZES32[i]
                if len(val) < 2 * SIZES32[i]:
                    break
                val = val.ljust(2 * SIZES64[j], "0")
                new[2 * OFFS64[j]:2 * (OFFS64[j] + SIZES64[j])] = list(val)
            self.to_qemu("G" + "".join(new), self.to_gdb)
            return
        if p.startswith("qSupported"):
            self.to_qemu(p, lambda r: self.to_gdb(r.replace(";QStartNoAckMode+", "")))
            return
        self.to_qemu(p, lambda r: self.to_gdb(self.strip_stop_regs(r)))

    def qemu_request_async_safe(self, payload):
        # GDB only writes all registers while the target is stopped and no other
        # request is outstanding, so a synchronous exchange is safe here.
        if self.pending:
            return None
        return self.qemu_request(payload)

    def handle_qemu_packet(self, p):
        if is_stop_reply(p) and not (self.pending and self.pending[0][0]):
            # Unsolicited stop (QEMU stops the VM when a debugger connects and
            # may announce it): nothing asked for it; GDB asks with '?'.
            return
        if not self.pending:
            self.to_gdb(p)
            return
        _, handler = self.pending.popleft()
        handler(p)

    def run(self):
        gfd = self.gin.fileno()
        while True:
            ready, _, _ = select.select([gfd, self.q], [], [])
            if gfd in ready:
                data = os.read(gfd, 65536)
                if not data:
                    return
                for kind, p in self.gr.feed(data):
                    if kind == "int":
                        self.q.sendall(b"\x03")
                    else:
                        self.gout.write(b"+")
                        self.gout.flush()
                        self.handle_gdb_packet(p)
            if self.q in ready:
                data = self.q.recv(65536)
                if not data:
                    return
                for kind, p in self.qr.feed(data):
                    if kind == "pkt":
                        self.q.sendall(b"+")
                        self.handle_qemu_packet(p)


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        sys.stderr.write(__doc__)
        return 2
    try:
        Bridge(sys.argv[1]).run()
    except (EOFError, BrokenPipeError, ConnectionError) as e:
        sys.stderr.write("gdb-i386-proxy: %s\n" % e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
