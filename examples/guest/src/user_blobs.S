/*
 * qmpprof example guest: the user programs, embedded in the kernel image.
 * build/<variant>/user/NAME.elf (with symbols; the same files GDB and the
 * profiler load) is found through the assembler include path
 * (-Wa,-I build/<variant>/user, see the Makefile). proc.c loads them.
 */
    .section .rodata.user_blobs, "a"

    .balign 16
    .globl user_crunch_elf, user_crunch_elf_end
user_crunch_elf:
    .incbin "crunch.elf"
user_crunch_elf_end:

    .balign 16
    .globl user_pulse_elf, user_pulse_elf_end
user_pulse_elf:
    .incbin "pulse.elf"
user_pulse_elf_end:

#ifndef __i386__
    /* workload=compat: crunch built as ELF32 (i386), run in compatibility mode */
    .balign 16
    .globl user_crunch32_elf, user_crunch32_elf_end
user_crunch32_elf:
    .incbin "crunch32.elf"
user_crunch32_elf_end:
#endif

    .section .note.GNU-stack, "", @progbits
