"""qmpprof: an external sampling profiler for QEMU guests, over QMP."""

__version__ = "0.1.0"
