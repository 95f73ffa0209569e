"""How one unwind step says the stack ends here (the unwinder turns it into a StopReason)."""

from __future__ import annotations

from qmpprof.model import StopReason


class StopUnwind(Exception):
    """Raised by a step that cannot go on: why, and the address it failed to read."""

    def __init__(self, reason: StopReason, address: int | None = None) -> None:
        super().__init__(reason.value)
        self.reason = reason
        self.address = address
