/*
 * qmpprof example guest: user-space entry point (one copy per program).
 *
 * The kernel starts a process here in ring 3 with rsp = USER_STACK_TOP
 * (16-byte aligned) and all other registers zero. _start calls the
 * program's main function (USER_MAIN, e.g. crunch_main, set by the
 * Makefile) and exits with its return value. rbp = 0 and
 * `.cfi_undefined rip` make _start the outermost frame: backtraces
 * (GDB, CFI or frame-pointer unwinders) end here.
 */
#include "uapi.h"

    .text
    .globl _start
    .type _start, @function
_start:
    .cfi_startproc
#ifndef __i386__
    .cfi_undefined rip
    xorl %ebp, %ebp
    call USER_MAIN
    movl %eax, %edi
#else
    /* i386: esp = USER_STACK_TOP (16-byte aligned), ebp = 0 */
    .cfi_undefined eip
    xorl %ebp, %ebp
    call USER_MAIN
    movl %eax, %ebx
#endif
    movl $SYS_EXIT, %eax
    int $SYSCALL_VECTOR
1:  jmp 1b
    .cfi_endproc
    .size _start, . - _start

    .section .note.GNU-stack, "", @progbits
