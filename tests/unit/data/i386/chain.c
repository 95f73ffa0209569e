/* cfi_chain.c's call chain as a 32-bit x86 (i386) program, for test_unwind_i386.py.
 *
 * Needs no C library (a 64-bit host rarely has the 32-bit one): built
 * `gcc -m32 -ffreestanding -nostdlib -static -fno-pie -fno-stack-protector` with the
 * flags under test (-O2 -fomit-frame-pointer: CFI only; -O0 -fno-omit-frame-pointer:
 * frame pointers; -fno-asynchronous-unwind-tables -g: .debug_frame only), run under GDB
 * with a breakpoint on every instruction of the chain. `_start` below calls main and
 * exits; its CFI marks the end of the stack, as a C library's does. */
#include "../cfi_chain.c"

__asm__(
    "	.text\n"
    "	.globl _start\n"
    "	.type _start, @function\n"
    "_start:\n"
    "	.cfi_startproc\n"
    "	.cfi_undefined eip\n"
    "	xorl %ebp, %ebp\n"
    "	movl %esp, %eax\n"
    "	andl $-16, %esp\n"
    "	subl $8, %esp\n"
    "	leal 4(%eax), %ecx\n"
    "	pushl %ecx\n"      /* argv */
    "	pushl (%eax)\n"    /* argc */
    "	call main\n"
    "	movl %eax, %ebx\n" /* exit(main's value) */
    "	movl $1, %eax\n"
    "	int $0x80\n"
    "	hlt\n"
    "	.cfi_endproc\n"
    "	.size _start, .-_start\n");
