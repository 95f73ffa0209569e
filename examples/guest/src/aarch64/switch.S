/*
 * qmpprof example guest, AArch64 build: context switch.
 *
 * void switch_context(uintptr_t *save_ksp, uintptr_t new_ksp,
 *                     uintptr_t new_ttbr0, volatile uint32_t *prev_on_cpu)
 *
 * Saves the callee-saved registers (frame record x29/x30 first, then
 * x19..x28: SWITCH_FRAME_SIZE = 96 bytes) on the current kernel stack, stores
 * sp to *save_ksp, switches to new_ksp, loads TTBR0_EL1 = new_ttbr0 (the
 * next process's L0 table with its ASID = pid in bits 63:48, or empty_l0
 * with ASID 0: no TLB flush needed, user pages are non-global), clears
 * *prev_on_cpu (if not NULL) and returns on the new stack. Its CFI is a plain
 * function's: the new stack has the same layout.
 */
#include "config.h"

    .text
    .globl switch_context
    .type switch_context, %function
switch_context:
    .cfi_startproc
    stp x29, x30, [sp, #-SWITCH_FRAME_SIZE]!
    .cfi_def_cfa_offset SWITCH_FRAME_SIZE
    .cfi_offset 29, -SWITCH_FRAME_SIZE
    .cfi_offset 30, (8 - SWITCH_FRAME_SIZE)
    mov x29, sp
    stp x19, x20, [sp, #16]
    stp x21, x22, [sp, #32]
    stp x23, x24, [sp, #48]
    stp x25, x26, [sp, #64]
    stp x27, x28, [sp, #80]
    .cfi_offset 19, (16 - SWITCH_FRAME_SIZE)
    .cfi_offset 20, (24 - SWITCH_FRAME_SIZE)
    .cfi_offset 21, (32 - SWITCH_FRAME_SIZE)
    .cfi_offset 22, (40 - SWITCH_FRAME_SIZE)
    .cfi_offset 23, (48 - SWITCH_FRAME_SIZE)
    .cfi_offset 24, (56 - SWITCH_FRAME_SIZE)
    .cfi_offset 25, (64 - SWITCH_FRAME_SIZE)
    .cfi_offset 26, (72 - SWITCH_FRAME_SIZE)
    .cfi_offset 27, (80 - SWITCH_FRAME_SIZE)
    .cfi_offset 28, (88 - SWITCH_FRAME_SIZE)
    mov x9, sp
    str x9, [x0]
    mov sp, x1
    msr ttbr0_el1, x2
    isb
    cbz x3, 1f
    stlr wzr, [x3]                      /* the previous context may run elsewhere now */
1:  ldp x19, x20, [sp, #16]
    ldp x21, x22, [sp, #32]
    ldp x23, x24, [sp, #48]
    ldp x25, x26, [sp, #64]
    ldp x27, x28, [sp, #80]
    ldp x29, x30, [sp], #SWITCH_FRAME_SIZE
    .cfi_def_cfa_offset 0
    .cfi_restore 29
    .cfi_restore 30
    ret
    .cfi_endproc
    .size switch_context, . - switch_context

    .section .note.GNU-stack, "", %progbits
