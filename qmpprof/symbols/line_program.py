"""The rows of one DWARF line program, decoded from its bytes.

pyelftools decodes a line program through construct and copies its state at every row:
about 1 s for one large kernel compilation unit (kernel/sched/core.c). This decodes the
same opcodes with plain byte reads, keeping only what a source line needs.

The program is untrusted: every read is checked against its end, a LEB128 number longer
than 16 bytes ends the decoding, and decoding stops at the first malformed opcode with the
rows read so far. Nothing here raises.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

#: (address, file index, line, end of sequence): one row of the line table.
Row = tuple[int, int, int, bool]

_MAX_LEB_BYTES = 16
_LNE_END_SEQUENCE, _LNE_SET_ADDRESS, _LNE_SET_DISCRIMINATOR = 1, 2, 4
_LNS_COPY, _LNS_ADVANCE_PC, _LNS_ADVANCE_LINE, _LNS_SET_FILE = 1, 2, 3, 4
_LNS_CONST_ADD_PC, _LNS_FIXED_ADVANCE_PC = 8, 9
#: Standard opcodes without operands (negate_stmt, basic_block, prologue_end,
#: epilogue_begin): nothing a source line needs changes.
_NO_OPERANDS = frozenset({6, 7, 10, 11})
#: Standard opcodes with one ULEB128 operand a source line does not need (column, isa).
_ONE_ULEB = frozenset({5, 12})


@dataclass(frozen=True)
class ProgramShape:
    """The header fields that steer the decoding (DWARF 5, 6.2.4)."""

    minimum_instruction_length: int
    maximum_operations_per_instruction: int
    line_base: int
    line_range: int
    opcode_base: int
    standard_opcode_lengths: tuple[int, ...]
    address_size: int
    little_endian: bool


class _Malformed(Exception):
    """The program ends inside an opcode, or an operand is absurd."""


def decode_rows(program: bytes, shape: ProgramShape) -> list[Row]:
    """The rows `program` emits, in order (as pyelftools' entries with a state)."""
    if shape.line_range <= 0 or shape.maximum_operations_per_instruction <= 0:
        return []
    decoder = _Decoder(program, shape)
    with contextlib.suppress(_Malformed):
        decoder.run()
    return decoder.rows


class _Decoder:
    def __init__(self, data: bytes, shape: ProgramShape) -> None:
        self.data = data
        self.shape = shape
        self.position = 0
        self.rows: list[Row] = []
        self._reset()

    def _reset(self) -> None:
        self.address, self.file, self.line, self.op_index = 0, 1, 1, 0

    def _emit(self, end_sequence: bool = False) -> None:
        self.rows.append((self.address, self.file, self.line, end_sequence))

    def run(self) -> None:
        data, base = self.data, self.shape.opcode_base
        while self.position < len(data):
            opcode = data[self.position]
            self.position += 1
            if opcode >= base:
                self._special(opcode - base)
            elif opcode == 0:
                self._extended()
            else:
                self._standard(opcode)

    def _special(self, adjusted: int) -> None:
        shape = self.shape
        operations = self.op_index + adjusted // shape.line_range
        per_instruction = shape.maximum_operations_per_instruction
        self.address += shape.minimum_instruction_length * (operations // per_instruction)
        self.op_index = operations % per_instruction
        self.line += shape.line_base + adjusted % shape.line_range
        self._emit()

    def _extended(self) -> None:
        length = self._uleb()
        opcode = self._bytes(1)[0]
        if opcode == _LNE_END_SEQUENCE:
            self._emit(end_sequence=True)
            self._reset()
        elif opcode == _LNE_SET_ADDRESS:
            raw = self._bytes(self.shape.address_size)
            self.address = int.from_bytes(raw, "little" if self.shape.little_endian else "big")
        elif opcode == _LNE_SET_DISCRIMINATOR:
            self._uleb()
        else:
            # define_file too: skipped, its file is named "?" (gone from DWARF 5, unused)
            self.position += max(0, length - 1)

    def _standard(self, opcode: int) -> None:
        shape = self.shape
        if opcode == _LNS_COPY:
            self._emit()
        elif opcode == _LNS_ADVANCE_PC:
            self.address += self._uleb() * shape.minimum_instruction_length
        elif opcode == _LNS_ADVANCE_LINE:
            self.line += self._sleb()
        elif opcode == _LNS_SET_FILE:
            self.file = self._uleb()
        elif opcode == _LNS_CONST_ADD_PC:
            step = (255 - shape.opcode_base) // shape.line_range
            self.address += step * shape.minimum_instruction_length
        elif opcode == _LNS_FIXED_ADVANCE_PC:
            raw = self._bytes(2)
            self.address += int.from_bytes(raw, "little" if shape.little_endian else "big")
        elif opcode in _ONE_ULEB:
            self._uleb()
        elif opcode not in _NO_OPERANDS:
            lengths = shape.standard_opcode_lengths
            for _ in range(lengths[opcode - 1] if opcode <= len(lengths) else 0):
                self._uleb()

    def _bytes(self, count: int) -> bytes:
        end = self.position + count
        if end > len(self.data):
            raise _Malformed
        chunk = self.data[self.position : end]
        self.position = end
        return chunk

    def _uleb(self) -> int:
        data, value, shift = self.data, 0, 0
        for index in range(self.position, min(self.position + _MAX_LEB_BYTES, len(data))):
            byte = data[index]
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                self.position = index + 1
                return value
        raise _Malformed

    def _sleb(self) -> int:
        start = self.position
        value = self._uleb()
        bits = 7 * (self.position - start)
        return value - (1 << bits) if value >> (bits - 1) & 1 else value
