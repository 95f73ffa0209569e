"""Linux, read from outside: everything qmpprof knows of a Linux guest's kernel.

- `adapter.py`: the task on each vCPU (`current`), its label, its saved user registers
  and kernel stack (LinuxAdapter).
- `kaslr.py`: the kernel's KASLR slide, from the IDT's divide-error gate.
- `modules.py`: the loaded modules, from the `modules` list.
- `maps.py`: a process's file mappings (maple tree, VMAs, dentry paths).
- `page_cache.py`: a file's pages in the page cache.
- `vmcoreinfo.py`, `kallsyms.py`, `from_memory.py`: the kernel itself read from guest
  memory when no vmlinux is given (VMCOREINFO, kallsyms, ORC and BTF).

Every module here is pure: guest memory comes in through a MemoryReader or as bytes,
and every value read from it is hostile.
"""
