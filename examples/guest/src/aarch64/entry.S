/*
 * qmpprof example guest, AArch64 build: exception vectors and stubs.
 *
 * Every exception the kernel handles enters a stub that builds a struct
 * exception_frame (FRAME_SIZE = 304 bytes, config.h) on the current SP_EL1:
 *
 *   sp+0   .. sp+240  x0 .. x30
 *   sp+248  interrupted sp (from EL0: SP_EL0; from EL1: sp + FRAME_SIZE)
 *   sp+256  interrupted pc (ELR_EL1: exact, do not subtract 1)
 *   sp+264  pstate (SPSR_EL1; M[3:0] = 0 EL0t, 5 EL1h)
 *   sp+272  ESR_EL1 (synchronous) or GICC_IAR (IRQ)
 *   sp+280  FAR_EL1 (synchronous)
 *   sp+288  frame record {interrupted x29, interrupted pc}; x29 points here
 *           while the C handler runs, so a frame-pointer walk goes handler ->
 *           stub -> interrupted function -> its callers (EL0 ones too).
 *
 * From EL0, SP_EL1 is the top of the process's kernel stack (it is where
 * the previous return to EL0 left it), so the frame of an exception from
 * EL0 is the topmost FRAME_SIZE bytes of the process's kernel stack.
 *
 * CFI: `.cfi_signal_frame`, return-address column 32 (DWARF "pc"), CFA =
 * sp + FRAME_SIZE once the frame is allocated (for an exception from EL1:
 * the interrupted sp); pc at CFA-48, x30 at CFA-64, sp at CFA-56, x0..x29 at
 * CFA-304+8n. Before ELR_EL1 is stored (the vector slot's branch and the
 * first five instructions of each stub) the interrupted pc is only in
 * ELR_EL1: the CFI says pc undefined there, so an unwinder stops at the stub.
 */
#include "config.h"

#define GICC_KVA        (KERNEL_VMA + GICC_PHYS)
#define GICC_IAR        0x0c
#define GICC_EOIR       0x10

/* CFI: the whole frame at sp (after it has been built). */
.macro frame_cfi
    .cfi_def_cfa sp, FRAME_SIZE
    .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30
    .cfi_offset \n, (\n * 8 - FRAME_SIZE)
    .endr
    .cfi_offset 31, (FRAME_SP - FRAME_SIZE)
    .cfi_offset 32, (FRAME_PC - FRAME_SIZE)
.endm

/* Start of a stub entered from a vector: nothing saved yet. */
.macro stub_start name
    .globl \name
    .type \name, %function
\name:
    .cfi_startproc simple
    .cfi_signal_frame
    .cfi_return_column 32
    .cfi_def_cfa sp, 0
    .cfi_undefined 32                   /* the interrupted pc is in ELR_EL1 */
.endm

/* Start of a stub entered with the frame already built (sp = frame). */
.macro stub_start_framed name
    .globl \name
    .type \name, %function
\name:
    .cfi_startproc simple
    .cfi_signal_frame
    .cfi_return_column 32
    frame_cfi
.endm

.macro stub_end name
    .cfi_endproc
    .size \name, . - \name
.endm

/* Build the frame; leaves x29 pointing at the frame record. */
.macro save_frame
    sub sp, sp, #FRAME_SIZE
    .cfi_def_cfa_offset FRAME_SIZE
    stp x0, x1, [sp, #0]
    .cfi_offset 0, -FRAME_SIZE
    .cfi_offset 1, (8 - FRAME_SIZE)
    mrs x0, elr_el1
    mrs x1, spsr_el1
    stp x0, x1, [sp, #FRAME_PC]
    .cfi_offset 32, (FRAME_PC - FRAME_SIZE)
    tst x1, #0xf                        /* M[3:0] == 0: from EL0t */
    mrs x1, sp_el0
    add x0, sp, #FRAME_SIZE
    csel x0, x1, x0, eq
    stp x30, x0, [sp, #FRAME_X30]
    .cfi_offset 30, (FRAME_X30 - FRAME_SIZE)
    .cfi_offset 31, (FRAME_SP - FRAME_SIZE)
    stp x2, x3, [sp, #16]
    stp x4, x5, [sp, #32]
    stp x6, x7, [sp, #48]
    stp x8, x9, [sp, #64]
    stp x10, x11, [sp, #80]
    stp x12, x13, [sp, #96]
    stp x14, x15, [sp, #112]
    stp x16, x17, [sp, #128]
    stp x18, x19, [sp, #144]
    stp x20, x21, [sp, #160]
    stp x22, x23, [sp, #176]
    stp x24, x25, [sp, #192]
    stp x26, x27, [sp, #208]
    stp x28, x29, [sp, #224]
    frame_cfi
    ldr x0, [sp, #FRAME_PC]
    stp x29, x0, [sp, #FRAME_RECORD]
    add x29, sp, #FRAME_RECORD
.endm

/* Restore the frame at sp and return (eret). */
.macro restore_frame_eret
    ldp x0, x1, [sp, #FRAME_PC]
    msr elr_el1, x0
    msr spsr_el1, x1
    tst x1, #0xf
    b.ne 1f
    ldr x0, [sp, #FRAME_SP]             /* back to EL0: its sp */
    msr sp_el0, x0
1:  ldp x2, x3, [sp, #16]
    ldp x4, x5, [sp, #32]
    ldp x6, x7, [sp, #48]
    ldp x8, x9, [sp, #64]
    ldp x10, x11, [sp, #80]
    ldp x12, x13, [sp, #96]
    ldp x14, x15, [sp, #112]
    ldp x16, x17, [sp, #128]
    ldp x18, x19, [sp, #144]
    ldp x20, x21, [sp, #160]
    ldp x22, x23, [sp, #176]
    ldp x24, x25, [sp, #192]
    ldp x26, x27, [sp, #208]
    ldp x28, x29, [sp, #224]
    ldr x30, [sp, #FRAME_X30]
    ldp x0, x1, [sp, #0]
    add sp, sp, #FRAME_SIZE
    .cfi_def_cfa_offset 0               /* same CFA: the frame is still below sp */
    eret
.endm

/* ---- vector table ---- */
    .text
    .balign 2048
    .globl exception_vectors
    .type exception_vectors, %function
exception_vectors:
    /* Nothing saved yet in a slot: the interrupted pc is only in ELR_EL1. */
    .cfi_startproc simple
    .cfi_signal_frame
    .cfi_return_column 32
    .cfi_def_cfa sp, 0
    .cfi_undefined 32
    .balign 128
    b exception_common                  /* current EL with SP_EL0: sync */
    .balign 128
    b exception_common                  /* IRQ */
    .balign 128
    b exception_common                  /* FIQ */
    .balign 128
    b exception_common                  /* SError */
    .balign 128
    b exception_common                  /* current EL with SP_ELx (EL1h): sync */
    .balign 128
    b timer_irq_entry                   /* IRQ from EL1 */
    .balign 128
    b exception_common                  /* FIQ */
    .balign 128
    b exception_common                  /* SError */
    .balign 128
    b syscall_entry                     /* lower EL, AArch64 (EL0): sync (SVC, faults) */
    .balign 128
    b timer_irq_entry                   /* IRQ from EL0 */
    .balign 128
    b exception_common                  /* FIQ */
    .balign 128
    b exception_common                  /* SError */
    .balign 128
    b exception_common                  /* lower EL, AArch32: sync */
    .balign 128
    b exception_common
    .balign 128
    b exception_common
    .balign 128
    b exception_common
    .balign 128
    .cfi_endproc
    .size exception_vectors, . - exception_vectors

/* IRQ (from EL1 or EL0): acknowledge at the GIC CPU interface; the timer
 * PPI is handled here, the reschedule SGI in resched_irq_entry. */
stub_start timer_irq_entry
    save_frame
    ldr x1, =GICC_KVA
    ldr w0, [x1, #GICC_IAR]
    str x0, [sp, #FRAME_ESR]
    and w2, w0, #0x3ff
    cmp w2, #RESCHED_SGI
    b.eq resched_irq_entry
    cmp w2, #TIMER_INTID
    b.ne 2f
    adrp x3, timer_interval             /* next tick in TIMER_HZ-th of a second */
    ldr x3, [x3, :lo12:timer_interval]
    msr cntv_tval_el0, x3
    isb
    str w0, [x1, #GICC_EOIR]            /* EOI before the handler (IRQs stay masked) */
    bl timer_interrupt_handler
    b 3f
2:  cmp w2, #GIC_SPURIOUS
    b.eq 3f
    str w0, [x1, #GICC_EOIR]            /* anything else: ignored */
3:  restore_frame_eret
stub_end timer_irq_entry

/* The reschedule IPI (SGI RESCHED_SGI); x0 = IAR, x1 = GICC. */
stub_start_framed resched_irq_entry
    str w0, [x1, #GICC_EOIR]
    bl resched_interrupt_handler
    restore_frame_eret
stub_end resched_irq_entry

/* Synchronous exception from EL0: SVC #0 is a system call (number in x8,
 * arguments x0, x1, result in x0, every other register preserved), anything
 * else a fault (exception_handler ends the process). */
stub_start syscall_entry
    save_frame
    mrs x0, esr_el1
    mrs x1, far_el1
    stp x0, x1, [sp, #FRAME_ESR]
    lsr x0, x0, #26                     /* exception class */
    cmp x0, #0x15                       /* SVC from AArch64 */
    b.ne 1f
    ldr x0, [sp, #64]                   /* nr = x8 */
    ldp x1, x2, [sp, #0]                /* a1 = x0, a2 = x1 */
    bl syscall_dispatch
    str x0, [sp, #0]
    b 2f
1:  mov x0, sp
    bl exception_handler
2:  restore_frame_eret
stub_end syscall_entry

/* Everything else (synchronous exceptions in EL1, unexpected vectors). */
stub_start exception_common
    save_frame
    mrs x0, esr_el1
    mrs x1, far_el1
    stp x0, x1, [sp, #FRAME_ESR]
    mov x0, sp
    bl exception_handler
    restore_frame_eret
stub_end exception_common

/* First return of a new process to EL0: switch_context "returns" here with
 * sp = the initial frame proc_create built (pc = _start, pstate = EL0t,
 * sp = the user stack top). */
stub_start_framed proc_start_user
    restore_frame_eret
stub_end proc_start_user
    .ltorg

    .section .note.GNU-stack, "", %progbits
