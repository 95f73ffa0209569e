"""From what one tick read to a symbolized Sample: pure, replayable, safe on any guest data.

Two steps, each done once per sample:
- `Analyzer.examine(raw)` unwinds the stack and asks the OS adapter for the process with
  the memory read so far, and says which address it still misses. The capture loop reads
  that memory and examines again (a few rounds at most); its last answer, a
  CapturedSample, travels on with the stack and process in it. `report` replays a
  capture's raw samples through the same step (`--reunwind`).
- `Analyzer.symbolize(captured)` names the frames.

Each sample runs in one AddressSpace: the kernel mapped over the upper half but for its
loaded modules' text (each mapped by name: `place_kernel_modules`), the user binary
identified for its CR3 (if any) over the lower half.
"""

from __future__ import annotations

from collections import abc
from dataclasses import dataclass, replace

from qmpprof.address_space import (
    AddressSpace,
    Mapping,
    file_mappings,
    kernel_mappings,
    user_mapping,
)
from qmpprof.defaults import DEFAULT_MAX_DEPTH
from qmpprof.errors import MemoryFault
from qmpprof.guest.adapter import GenericAdapter, OsAdapter
from qmpprof.guest.kernel_types import KernelTypes
from qmpprof.guest.mode import mode_of
from qmpprof.isa.registry import ISAS
from qmpprof.memory import MemoryReader, WindowMemory
from qmpprof.model import (
    CapturedSample,
    FileMapping,
    Frame,
    FrameAddress,
    FrameKind,
    KernelModule,
    Mode,
    NoUserSymbols,
    RawSample,
    Recovery,
    Sample,
    StopReason,
    Unsymbolized,
    UnwoundStack,
)
from qmpprof.modules import Module
from qmpprof.symbols.symbolizer import Symbolizer
from qmpprof.unwind.rules import RIP
from qmpprof.unwind.unwinder import (
    FIRST_CODE_ADDRESS,
    Strategy,
    dwarf_registers,
    unwind,
    word_for,
)
from qmpprof.user_files import UserFiles

#: Address spaces kept built: one per process map seen (a guest forking busily makes
#: many); past this many they are built again.
MAX_ADDRESS_SPACES = 256
#: vCPUs whose last sample `symbolize` keeps, before it starts over.
MAX_REMEMBERED_VCPUS = 4096


@dataclass(frozen=True)
class Examined:
    """A sample unwound with the memory it has, and the addresses it still misses: the
    one the unwind faulted on, then the one the OS adapter needed (each independent of
    the other); empty when nothing is missing."""

    sample: CapturedSample
    missing: tuple[int, ...]


class Analyzer:
    """Unwinds, symbolizes and labels raw samples with one kernel and its user binaries."""

    def __init__(
        self,
        kernel: Module | None = None,
        users: abc.Mapping[str, Module] | None = None,
        adapter: OsAdapter | None = None,
        strategy: Strategy = Strategy.AUTO,
        max_depth: int = DEFAULT_MAX_DEPTH,
        biases: abc.Mapping[str, int] | None = None,
        files: UserFiles | None = None,
        kernel_types: KernelTypes | None = None,
    ) -> None:
        """`biases`: the load bias of each module (by name) not running at its link
        address (a KASLR kernel, a PIE program); zero for the others. `files`: where the
        host copies of the files in a sample's process map are found (--sysroot)."""
        self.kernel = kernel
        self.users = dict(users or {})
        self.adapter: OsAdapter = adapter or GenericAdapter()
        self.strategy = strategy
        self.max_depth = max_depth
        self.biases = dict(biases or {})
        self.files = files or UserFiles()
        #: Where the kernel's struct layouts come from: its ELF, or its memory.
        self.kernel_types = kernel_types
        #: Where the kernel came from, when not from a file: one line for the summary.
        self.kernel_source: str | None = None
        #: The release of a kernel read from memory (its uname -r), for titles.
        self.kernel_release: str | None = None
        self._spaces: dict[object, tuple[AddressSpace, Symbolizer]] = {}
        #: Counts the changes of the kernel, its modules and the files known: a sample
        #: examined at one generation is examined again at another.
        self.generation = 0
        self.kernel_modules: tuple[KernelModule, ...] = ()
        self.kernel_module_files: dict[str, Module] = {}
        #: Per vCPU, the last sample symbolized: (what it was made of, its generation,
        #: the Sample). A halted vCPU's replayed sample (Capturer._unchanged) is then not
        #: symbolized again: most samples of a mostly idle VM with many vCPUs.
        self._last_symbolized: dict[int, tuple[CapturedSample, int, Sample]] = {}

    def use_kernel(self, kernel: Module, adapter: OsAdapter, types: KernelTypes) -> None:
        """Analyze with this kernel from now on (one read from the guest's memory once
        connected), at its link address until `relocate_kernel`."""
        self.kernel, self.adapter, self.kernel_types = kernel, adapter, types
        self.biases.pop(kernel.name, None)
        self._changed()

    def forget_kernel(self) -> None:
        """Analyze without a kernel again (the one read from memory did not check)."""
        if self.kernel is not None:
            self.biases.pop(self.kernel.name, None)
        self.kernel, self.adapter, self.kernel_types = None, GenericAdapter(), None
        self.kernel_source = self.kernel_release = None
        self._changed()

    @property
    def kernel_bias(self) -> int:
        """How far from its link address the kernel runs (0 without a kernel)."""
        return self.biases.get(self.kernel.name, 0) if self.kernel is not None else 0

    def relocate_kernel(self, bias: int) -> None:
        """The kernel runs `bias` bytes from its link address (a KASLR slide, found once
        connected or read from a capture): its mapping and the OS adapter move with it.
        Nothing to move without a kernel."""
        if self.kernel is None:
            return
        self.biases[self.kernel.name] = bias
        self._changed()
        self.adapter.relocate(bias)

    def place_kernel_modules(
        self, loaded: abc.Iterable[KernelModule], files: abc.Mapping[str, Module] | None = None
    ) -> None:
        """The kernel has these modules loaded (read from the guest, or from a
        capture): each is mapped at its text, with the symbols of its file in `files`
        (by name) or by name alone. One that overlaps the kernel's own code or a module
        before it (by base) is left out: guest data is hostile."""
        self.kernel_modules = self._disjoint(sorted(loaded, key=lambda m: (m.base, m.end)))
        self.kernel_module_files = dict(files or {})
        self._changed()

    def _disjoint(self, loaded: list[KernelModule]) -> tuple[KernelModule, ...]:
        if self.kernel is None:
            return ()
        bias = self.kernel_bias
        start, end = self.kernel.extent[0] + bias, self.kernel.extent[1] + bias
        kept: list[KernelModule] = []
        for module in loaded:
            clear_of_kernel = module.end <= start or module.base >= end
            if clear_of_kernel and (not kept or kept[-1].end <= module.base):
                kept.append(module)
        return tuple(kept)

    def forget_address_spaces(self) -> None:
        """Build each sample's address space anew: `files` knows more files now."""
        self._changed()

    def _changed(self) -> None:
        """What examines a sample changed: address spaces are built anew, and an
        examination made before may not be what one would make now (`generation`)."""
        self._spaces.clear()
        self.generation += 1

    def kernel_module_at(self, address: int) -> KernelModule | None:
        """The placed module whose text holds `address`, if any."""
        return next((m for m in self.kernel_modules if m.base <= address < m.end), None)

    @property
    def modules(self) -> list[Module]:
        """Every binary given: the kernel first."""
        return [m for m in (self.kernel, *self.users.values()) if m is not None]

    @property
    def kernel_bits(self) -> int:
        """The width of the kernel's code: 32 for an ELF32 kernel, else 64."""
        return 8 * self.kernel.word if self.kernel is not None else 64

    def kernel_code(self, address: int, size: int) -> bytes | None:
        """The kernel file's code at running `address`, if it has it there."""
        if self.kernel is None:
            return None
        try:
            return self.kernel.code.read(address - self.kernel_bias, size)
        except MemoryFault:
            return None

    @property
    def has_kernel_symbols(self) -> bool:
        return self.kernel is not None and len(self.kernel.symbols) > 0

    def _space_and_symbolizer(self, raw: RawSample) -> tuple[AddressSpace, Symbolizer]:
        """The address space `raw` ran in: its process map's files when it has one, else
        the user binary identified for it (by name), over the kernel's mappings."""
        name = raw.user_module if raw.user_module in self.users else None
        key: object = raw.file_maps if raw.file_maps is not None else name
        if key not in self._spaces:
            if len(self._spaces) >= MAX_ADDRESS_SPACES:
                self._spaces.clear()
            mappings = self._mappings(self.users.get(name or ""), raw.file_maps)
            space = AddressSpace(mappings, use_orc=self.strategy is Strategy.AUTO)
            self._spaces[key] = (space, Symbolizer(space))
        return self._spaces[key]

    def _mappings(
        self, user: Module | None, file_maps: tuple[FileMapping, ...] | None
    ) -> list[Mapping]:
        kernel: list[Mapping] = []
        if self.kernel is not None:
            kernel = kernel_mappings(
                self.kernel, self.kernel_bias, self.kernel_modules, self.kernel_module_files
            )
        if file_maps is not None:
            return [*kernel, *file_mappings(file_maps, self.files.module_for)]
        low = next((m for m in kernel if m.module is self.kernel), None)
        users = user_mapping(user, self.biases.get(user.name, 0), low) if user else []
        return [*kernel, *users]

    def examine(self, raw: RawSample, memory: MemoryReader | None = None) -> Examined:
        """`raw`'s stack and process as far as its memory allows, and what it misses.
        `memory`: where to read (a FetchingMemory while the guest is paused); `raw`'s
        windows by default."""
        memory = memory if memory is not None else WindowMemory(raw.windows)
        missing = []
        if not raw.windows:
            leaf = FrameAddress(raw.registers.pc, FrameKind.INSTRUCTION)
            stack = UnwoundStack((leaf,), StopReason.NO_STACK)
        else:  # one address space for both unwinds (its key hashes the process's maps)
            space = self._space_and_symbolizer(raw)[0]
            stack = self._unwind(raw, memory, space)
            try:
                stack = self._with_user_side(raw, stack, memory, space)
            except MemoryFault as fault:
                missing.append(fault.address)
        if stack.stop is StopReason.FAULT and stack.fault_address is not None:
            missing.insert(0, stack.fault_address)
        try:
            process = self.adapter.process(raw.registers, memory)
        except MemoryFault as fault:
            process = None
            missing.append(fault.address)
        return Examined(CapturedSample(raw, stack, process), tuple(missing))

    def _with_user_side(
        self, raw: RawSample, stack: UnwoundStack, memory: MemoryReader, space: AddressSpace
    ) -> UnwoundStack:
        """A kernel stack that never got back to user space, continued from the user
        registers the OS saved when the task entered the kernel (as perf does): the
        kernel's own tables mark some entry and exit code as the end of the stack.
        Raises MemoryFault."""
        kernel_half = space.kernel_floor
        if any(f.address < kernel_half for f in stack.frames):
            return stack
        user = self.adapter.user_registers(raw.registers, memory)
        pc = user[RIP] if user is not None else None
        if user is None or pc is None or not FIRST_CODE_ADDRESS <= pc < kernel_half:
            return stack
        depth = self.max_depth - len(stack.frames)
        if depth <= 0:
            return stack
        word = word_for(raw.registers.bits)
        isa = ISAS[raw.registers.isa]
        rest = unwind(user, memory, space, self.strategy, space.code, depth, word, isa)
        first = FrameAddress(
            rest.frames[0].address, FrameKind.INSTRUCTION, Recovery.SAVED_USER_REGISTERS
        )
        frames = (*stack.frames, first, *rest.frames[1:])
        return UnwoundStack(frames, rest.stop, rest.fault_address)

    def _unwind(self, raw: RawSample, memory: MemoryReader, space: AddressSpace) -> UnwoundStack:
        regs = raw.registers
        registers = dwarf_registers(regs)
        word, isa = word_for(regs.bits), ISAS[regs.isa]
        return unwind(
            registers, memory, space, self.strategy, space.code, self.max_depth, word, isa
        )

    def is_torn(self, captured: CapturedSample) -> bool:
        """Whether a return address on `captured`'s stack follows no call in the code
        mapped there: the `Sample.torn` that `symbolize` sets, known before it (a
        nonblocking capture takes such a sample again). A stack read while the guest
        ran, half before and half after a call or return, or garbage. Never for a Linux
        kernel's frames (ReturnSites: its code is rewritten at boot)."""
        return _torn(self._space_and_symbolizer(captured.raw)[0], captured.stack)

    def analyze(self, raw: RawSample) -> Sample:
        """Examine and symbolize `raw` with the memory it has (no more can be read)."""
        return self.symbolize(self.examine(raw).sample)

    def symbolize(self, captured: CapturedSample) -> Sample:
        """The Sample for a captured (or replayed) stack."""
        raw = captured.raw
        last = self._last_symbolized.get(raw.vcpu)
        if last is not None and last[1] == self.generation and _replayed(last[0], captured):
            return replace(last[2], time=raw.time)
        sample = self._symbolized(captured)
        if len(self._last_symbolized) >= MAX_REMEMBERED_VCPUS:  # vCPU numbers are QEMU's
            self._last_symbolized.clear()
        self._last_symbolized[raw.vcpu] = (captured, self.generation, sample)
        return sample

    def _symbolized(self, captured: CapturedSample) -> Sample:
        raw, stack = captured.raw, captured.stack
        space, symbolizer = self._space_and_symbolizer(raw)
        frames = tuple(symbolizer.symbolize(f) for f in stack.frames)
        mode = mode_of(raw.registers)
        return Sample(
            time=raw.time,
            vcpu=raw.vcpu,
            mode=mode,
            frames=frames,
            stop=stack.stop,
            address_space=raw.address_space,
            process=captured.process,
            fault_address=stack.fault_address,
            unsymbolized=self._why_unsymbolized(raw, mode, frames[0]),
            torn=_torn(space, stack),
            bits=raw.registers.bits,
        )

    def _why_unsymbolized(self, raw: RawSample, mode: Mode, leaf: Frame) -> Unsymbolized | None:
        if mode is not Mode.USER or leaf.function is not None:
            return None
        if raw.file_maps is not None:
            return self._why_unnamed_in_process(leaf)
        if not self.users:
            return Unsymbolized(NoUserSymbols.NO_BINARIES)
        if raw.user_module is None:
            return Unsymbolized(NoUserSymbols.NO_MATCH, f"cr3:{raw.address_space:#x}")
        return Unsymbolized(NoUserSymbols.OUTSIDE, raw.user_module)

    def _why_unnamed_in_process(self, leaf: Frame) -> Unsymbolized:
        """A leaf in a process whose maps are known: in no file it maps, in a file with
        no usable host copy, or outside the symbols of the copy found."""
        if leaf.mapping is None or leaf.module is None:
            return Unsymbolized(NoUserSymbols.NO_FILE)
        if self.files.module_for(leaf.mapping) is None:
            return Unsymbolized(NoUserSymbols.NO_HOST_FILE, leaf.module)
        return Unsymbolized(NoUserSymbols.OUTSIDE, leaf.module)


def _replayed(before: CapturedSample, now: CapturedSample) -> bool:
    """Whether `now` is `before` again but for its time: the very objects it was made
    of, as Capturer._unchanged replays a halted vCPU's sample."""
    a, b = before.raw, now.raw
    return (
        before.stack is now.stack
        and before.process is now.process
        and a.registers is b.registers
        and a.windows is b.windows
        and a.user_module == b.user_module
        and a.error == b.error
        and a.file_maps is b.file_maps
    )


def _torn(space: AddressSpace, stack: UnwoundStack) -> bool:
    """Whether a return address on `stack` follows no call in the code `space` maps."""
    return any(
        f.kind is FrameKind.RETURN and space.return_sites.check(f.address) is False
        for f in stack.frames
    )
