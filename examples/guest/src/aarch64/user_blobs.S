/*
 * qmpprof example guest, AArch64 build: the user programs, embedded in the
 * kernel image (build/aarch64-<variant>/user/NAME.elf, found through the
 * assembler include path, see the Makefile). proc.c loads them.
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

    .section .note.GNU-stack, "", %progbits
