"""A decoder and a bounded evaluator for the DWARF expressions compilers put in CFI.

Compilers emit expressions in CFI for PLT entries, realigned stacks and signal or
interrupt frames. This evaluates the stack-machine subset those use, over unsigned
values of the code's word (64 bits, or 32 for i386 code: DWARF's generic type is an
address wide), with a bounded stack and a bounded number of steps; anything else
raises UnsupportedExpression. Memory reads raise MemoryFault.

Expressions are decoded into the internal register numbering like the rest of their
CFI (numbering.py): i386's DW_OP_breg5 (ebp) becomes DW_OP_breg6.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from qmpprof.errors import BadCfi, UnsupportedExpression
from qmpprof.memory import MemoryReader, read_word
from qmpprof.unwind.cfi_entries import Reader
from qmpprof.unwind.numbering import OTHER

MASK = (1 << 64) - 1
MASK32 = (1 << 32) - 1
MAX_STACK = 64
MAX_STEPS = 256


@dataclass(frozen=True, slots=True)
class Op:
    """One operation: its DW_OP name and integer arguments."""

    name: str
    args: tuple[int, ...] = ()


Expression = tuple[Op, ...]

# Operand layouts of the operations decoded (DWARF 5, section 7.7.1): "1u" an unsigned
# byte, "2s" a signed 16-bit number, "u"/"s" LEB128, "a" an address (8 or 4 bytes).
_OPERANDS: dict[int, tuple[str, str]] = {
    0x03: ("DW_OP_addr", "a"),
    0x06: ("DW_OP_deref", ""),
    0x08: ("DW_OP_const1u", "1u"),
    0x09: ("DW_OP_const1s", "1s"),
    0x0A: ("DW_OP_const2u", "2u"),
    0x0B: ("DW_OP_const2s", "2s"),
    0x0C: ("DW_OP_const4u", "4u"),
    0x0D: ("DW_OP_const4s", "4s"),
    0x0E: ("DW_OP_const8u", "8u"),
    0x0F: ("DW_OP_const8s", "8s"),
    0x10: ("DW_OP_constu", "u"),
    0x11: ("DW_OP_consts", "s"),
    0x12: ("DW_OP_dup", ""),
    0x13: ("DW_OP_drop", ""),
    0x14: ("DW_OP_over", ""),
    0x15: ("DW_OP_pick", "1u"),
    0x16: ("DW_OP_swap", ""),
    0x17: ("DW_OP_rot", ""),
    0x19: ("DW_OP_abs", ""),
    0x1A: ("DW_OP_and", ""),
    0x1B: ("DW_OP_div", ""),
    0x1C: ("DW_OP_minus", ""),
    0x1D: ("DW_OP_mod", ""),
    0x1E: ("DW_OP_mul", ""),
    0x1F: ("DW_OP_neg", ""),
    0x20: ("DW_OP_not", ""),
    0x21: ("DW_OP_or", ""),
    0x22: ("DW_OP_plus", ""),
    0x23: ("DW_OP_plus_uconst", "u"),
    0x24: ("DW_OP_shl", ""),
    0x25: ("DW_OP_shr", ""),
    0x26: ("DW_OP_shra", ""),
    0x27: ("DW_OP_xor", ""),
    0x28: ("DW_OP_bra", "2s"),
    0x29: ("DW_OP_eq", ""),
    0x2A: ("DW_OP_ge", ""),
    0x2B: ("DW_OP_gt", ""),
    0x2C: ("DW_OP_le", ""),
    0x2D: ("DW_OP_lt", ""),
    0x2E: ("DW_OP_ne", ""),
    0x2F: ("DW_OP_skip", "2s"),
    **{0x30 + n: (f"DW_OP_lit{n}", "") for n in range(32)},
    **{0x50 + n: (f"DW_OP_reg{n}", "") for n in range(32)},
    **{0x70 + n: (f"DW_OP_breg{n}", "s") for n in range(32)},
    0x90: ("DW_OP_regx", "u"),
    0x92: ("DW_OP_bregx", "us"),
    0x94: ("DW_OP_deref_size", "1u"),
    0x96: ("DW_OP_nop", ""),
    0x9C: ("DW_OP_call_frame_cfa", ""),
}
_BRANCHES = ("DW_OP_skip", "DW_OP_bra")


def decode_expression(
    block: bytes, address_size: int = 8, to_internal: Callable[[int], int] | None = None
) -> Expression:
    """The operations of a DWARF expression, branch targets resolved to op indexes.

    `address_size`: DW_OP_addr's operand bytes. `to_internal`: the registers it names
    are translated to the internal numbers by it (numbering.py; one without a twin there
    becomes an operation the evaluator refuses); None: they are x86-64's.

    Never raises: an operation this module does not know, or one cut short, becomes
    an Op the evaluator refuses (UnsupportedExpression), so only an unwind that
    reaches it fails. A branch into the middle of an operation gets target -1.
    """
    reader = Reader(block, 0, len(block))
    decoded: list[tuple[Op, int]] = []  # (op, offset of the next one)
    offsets: dict[int, int] = {}
    while not reader.at_end():
        offsets[reader.position] = len(decoded)
        opcode = reader.u8()
        if opcode not in _OPERANDS:
            decoded.append((Op(f"unknown DW_OP {opcode:#04x}"), len(block)))
            break  # the size of its operands is unknown: nothing after it can be decoded
        name, layout = _OPERANDS[opcode]
        try:
            op = Op(name, _operands(reader, layout, address_size))
        except BadCfi:
            decoded.append((Op(f"cut short: {name}"), len(block)))
            break
        decoded.append((_renumbered(op, to_internal) if to_internal else op, reader.position))
    offsets[len(block)] = len(decoded)
    return tuple(_resolve_branch(op, end, offsets) for op, end in decoded)


def _operands(reader: Reader, layout: str, address_size: int) -> tuple[int, ...]:
    if layout == "a":
        return (reader.unsigned(address_size),)
    if layout in ("u", "s", "us"):
        return tuple(reader.uleb() if kind == "u" else reader.sleb() for kind in layout)
    if layout:
        size = int(layout[0])
        return (reader.signed(size) if layout[1] == "s" else reader.unsigned(size),)
    return ()


def _renumbered(op: Op, to_internal: Callable[[int], int]) -> Op:
    """`op` with the register it names renumbered (numbering.py)."""
    name = op.name
    if name in ("DW_OP_regx", "DW_OP_bregx"):
        return Op(name, (to_internal(op.args[0]), *op.args[1:]))
    for prefix in ("DW_OP_reg", "DW_OP_breg"):
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            number = to_internal(int(name[len(prefix) :]))
            if number >= OTHER:  # no internal twin: refused where evaluated
                return Op(f"register {number - OTHER} with no slot in {name}", op.args)
            return Op(f"{prefix}{number}", op.args)
    return op


def _resolve_branch(op: Op, end: int, offsets: dict[int, int]) -> Op:
    if op.name not in _BRANCHES:
        return op
    return Op(op.name, (offsets.get(end + op.args[0], -1),))


#: Binary operations over (left, right, the word's bit count).
_BINARY: dict[str, Callable[[int, int, int], int]] = {
    "DW_OP_plus": lambda a, b, bits: a + b,
    "DW_OP_minus": lambda a, b, bits: a - b,
    "DW_OP_mul": lambda a, b, bits: a * b,
    "DW_OP_and": lambda a, b, bits: a & b,
    "DW_OP_or": lambda a, b, bits: a | b,
    "DW_OP_xor": lambda a, b, bits: a ^ b,
    "DW_OP_shl": lambda a, b, bits: a << b if b < bits else 0,
    "DW_OP_shr": lambda a, b, bits: a >> b if b < bits else 0,
    "DW_OP_shra": lambda a, b, bits: _signed(a, bits) >> min(b, bits - 1),
    "DW_OP_ge": lambda a, b, bits: int(_signed(a, bits) >= _signed(b, bits)),
    "DW_OP_gt": lambda a, b, bits: int(_signed(a, bits) > _signed(b, bits)),
    "DW_OP_le": lambda a, b, bits: int(_signed(a, bits) <= _signed(b, bits)),
    "DW_OP_lt": lambda a, b, bits: int(_signed(a, bits) < _signed(b, bits)),
    "DW_OP_eq": lambda a, b, bits: int(a == b),
    "DW_OP_ne": lambda a, b, bits: int(a != b),
}


def evaluate(
    expression: Expression,
    registers: Sequence[int | None],
    memory: MemoryReader,
    initial: Sequence[int] = (),
    word: int = 8,
) -> int:
    """The value on top of the stack after running `expression`.

    `registers` is indexed by DWARF register number (None: unknown). `initial` is
    pushed first (the CFA, for register rules). `word`: the code's word in bytes, 8
    or 4: the values' width (modulo 2**(8 * word)) and what DW_OP_deref reads.
    """
    mask = MASK if word == 8 else MASK32
    stack = [value & mask for value in initial]
    position = steps = 0
    while position < len(expression):
        steps += 1
        if steps > MAX_STEPS:
            raise UnsupportedExpression("CFI expression runs too long")
        position = _step(expression, position, stack, registers, memory, mask)
        if len(stack) > MAX_STACK:
            raise UnsupportedExpression("CFI expression stack overflow")
    if not stack:
        raise UnsupportedExpression("CFI expression left nothing on the stack")
    return stack[-1]


def _step(
    expression: Expression,
    position: int,
    stack: list[int],
    registers: Sequence[int | None],
    memory: MemoryReader,
    mask: int,
) -> int:
    """Run the operation at `position`; returns the position of the next one."""
    op = expression[position]
    name = op.name
    if name in _BINARY:
        right, left = _pop(stack), _pop(stack)
        stack.append(_BINARY[name](left, right, mask.bit_length()) & mask)
    elif name.startswith("DW_OP_lit"):
        stack.append(int(name[9:]))
    elif name.startswith("DW_OP_const"):
        stack.append(_arg(op) & mask)
    elif name.startswith("DW_OP_breg") and name != "DW_OP_bregx":
        stack.append((_register(registers, int(name[10:])) + _arg(op)) & mask)
    elif name == "DW_OP_bregx":
        stack.append((_register(registers, op.args[0]) + op.args[1]) & mask)
    elif name in ("DW_OP_skip", "DW_OP_bra"):
        return _branch(expression, position, stack, op)
    else:
        _stack_op(op, stack, memory, mask)
    return position + 1


def _stack_op(op: Op, stack: list[int], memory: MemoryReader, mask: int) -> None:
    name = op.name
    if name == "DW_OP_plus_uconst":
        stack.append((_pop(stack) + _arg(op)) & mask)
    elif name == "DW_OP_deref":
        stack.append(read_word(memory, _pop(stack), 8 if mask == MASK else 4))
    elif name == "DW_OP_deref_size":
        address = _pop(stack)
        stack.append(int.from_bytes(memory.read(address, _arg(op)), "little") & mask)
    elif name in ("DW_OP_neg", "DW_OP_not", "DW_OP_abs"):
        value = _pop(stack)
        signed = _signed(value, mask.bit_length())
        result = {"DW_OP_neg": -value, "DW_OP_not": ~value, "DW_OP_abs": abs(signed)}
        stack.append(result[name] & mask)
    elif name in ("DW_OP_dup", "DW_OP_over", "DW_OP_pick"):
        index = {"DW_OP_dup": 0, "DW_OP_over": 1}.get(name, op.args[0] if op.args else 0)
        if index >= len(stack):
            raise UnsupportedExpression(f"{name} past the bottom of the stack")
        stack.append(stack[-1 - index])
    elif name in ("DW_OP_drop", "DW_OP_swap", "DW_OP_rot", "DW_OP_nop"):
        _shuffle(name, stack)
    else:
        raise UnsupportedExpression(f"unsupported CFI expression operation {name}")


def _shuffle(name: str, stack: list[int]) -> None:
    if name == "DW_OP_drop":
        _pop(stack)
    elif name == "DW_OP_swap":
        right, left = _pop(stack), _pop(stack)
        stack.extend((right, left))
    elif name == "DW_OP_rot":
        top, second, third = _pop(stack), _pop(stack), _pop(stack)
        stack.extend((top, third, second))


def _branch(expression: Expression, position: int, stack: list[int], op: Op) -> int:
    """Follow DW_OP_skip/bra. The targets were resolved to op indexes at compile time."""
    taken = op.name == "DW_OP_skip" or _pop(stack) != 0
    target = op.args[0] if taken else position + 1
    if not 0 <= target <= len(expression):
        raise UnsupportedExpression("CFI expression branches outside itself")
    return target


def _pop(stack: list[int]) -> int:
    if not stack:
        raise UnsupportedExpression("CFI expression pops an empty stack")
    return stack.pop()


def _arg(op: Op) -> int:
    if not op.args:
        raise UnsupportedExpression(f"{op.name} without its operand")
    return op.args[0]


def _register(registers: Sequence[int | None], number: int) -> int:
    value = registers[number] if 0 <= number < len(registers) else None
    if value is None:
        raise UnsupportedExpression(f"CFI expression needs register {number}, unknown here")
    return value


def _signed(value: int, bits: int) -> int:
    return value - (1 << bits) if value >> (bits - 1) & 1 else value
