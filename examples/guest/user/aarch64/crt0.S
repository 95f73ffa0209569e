/*
 * qmpprof example guest, AArch64 build: user-space entry point (one copy per
 * program).
 *
 * The kernel starts a process here in EL0 with sp = USER_STACK_TOP (16-byte
 * aligned) and all other registers zero. _start calls the program's main
 * function (USER_MAIN, set by the Makefile) and exits with its return value.
 * x29 = 0 and `.cfi_undefined x30` make _start the outermost frame:
 * backtraces (GDB, CFI or frame-pointer unwinders) end here.
 */
#include "uapi.h"

    .text
    .globl _start
    .type _start, %function
_start:
    .cfi_startproc
    .cfi_undefined x30
    mov x29, #0
    mov x30, #0
    bl USER_MAIN
    mov x8, #SYS_EXIT
    svc #0
1:  b 1b
    .cfi_endproc
    .size _start, . - _start

    .section .note.GNU-stack, "", %progbits
