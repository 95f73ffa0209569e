/* The AArch64 Linux guest's init (PID 1): ../init.c itself, built for arm64 (the
 * Makefile: aarch64-linux-gnu-gcc -static), so it says the same lines
 * ("qmpprof-linux: kallsyms ...", "maps ...", "started NAME pid N", "ready") and starts
 * the same workloads.
 *
 * One difference: ../init.c looks up x86's divide-error handler in /proc/kallsyms, which
 * arm64 has not. Its one strcmp() is pointed here, where that name stands for
 * KALLSYMS_ANCHOR instead: `vectors`, the exception vector table (VBAR_EL1), so the line
 * reads "qmpprof-linux: kallsyms ADDRESS vectors": the running address, and so the KASLR
 * slide against the debug vmlinux's (tests/linux_vm_aarch64.py). ../init.c's crc8.ko is
 * built into Debian's arm64 kernels (CONFIG_CRC8=y): init says it cannot load it, on
 * stderr, and goes on. */
#include <string.h>

#ifndef KALLSYMS_ANCHOR
#define KALLSYMS_ANCHOR "vectors"
#endif

static int anchor_strcmp(const char *name, const char *wanted) {
    return strcmp(name, strcmp(wanted, "asm_exc_divide_error") == 0 ? KALLSYMS_ANCHOR : wanted);
}

#define strcmp anchor_strcmp
#include "../init.c"
