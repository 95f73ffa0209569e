"""Defaults and sizes used in more than one place, defined once. Imports nothing."""

from __future__ import annotations

#: Bytes of stack read above RSP per vCPU and tick (`--stack-bytes`): four pages, a
#: whole kernel stack of the example guest and most of a Linux one.
DEFAULT_STACK_BYTES = 16 * 1024
#: Most frames per unwound stack (`--max-depth`).
DEFAULT_MAX_DEPTH = 128
#: Samples per second (`--rate`): not a divisor of common timer rates, so sampling does
#: not fall in step with the guest's own periodic work.
DEFAULT_RATE_HZ = 99.0
#: x86's smallest page, the unit of page-table walks and of memory reads that may fault.
PAGE_SHIFT = 12
PAGE_SIZE = 1 << PAGE_SHIFT
