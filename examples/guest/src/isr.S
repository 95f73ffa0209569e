/*
 * qmpprof example guest: interrupt entry stubs.
 *
 * Frame layout after `push %rbp; mov %rsp,%rbp` in every stub:
 *
 *     rbp+40  SS          \
 *     rbp+32  RSP          |  pushed by the CPU
 *     rbp+24  RFLAGS       |  (CFA = rsp+40 at the first instruction
 *     rbp+16  CS           |   of the timer stub)
 *     rbp+8   RIP         /   <- interrupted RIP
 *     rbp+0   saved RBP       <- interrupted RBP
 *
 * So a frame-pointer walk from the C handler goes handler -> stub ->
 * interrupted function -> its callers, and DWARF CFI (signal frame, CFA,
 * rip and rsp taken from the hardware frame) lets GDB do the same.
 */
#include "config.h"

/* Push the caller-saved registers (rbp already pushed, CFA = rbp + \cfa). */
.macro SAVE_SCRATCH cfa
    pushq %rax
    .cfi_offset %rax, -(\cfa + 8)
    pushq %rcx
    .cfi_offset %rcx, -(\cfa + 16)
    pushq %rdx
    .cfi_offset %rdx, -(\cfa + 24)
    pushq %rsi
    .cfi_offset %rsi, -(\cfa + 32)
    pushq %rdi
    .cfi_offset %rdi, -(\cfa + 40)
    pushq %r8
    .cfi_offset %r8, -(\cfa + 48)
    pushq %r9
    .cfi_offset %r9, -(\cfa + 56)
    pushq %r10
    .cfi_offset %r10, -(\cfa + 64)
    pushq %r11
    .cfi_offset %r11, -(\cfa + 72)
.endm

.macro RESTORE_SCRATCH
    popq %r11
    popq %r10
    popq %r9
    popq %r8
    popq %rdi
    popq %rsi
    popq %rdx
    popq %rcx
    popq %rax
    .cfi_restore %rax
    .cfi_restore %rcx
    .cfi_restore %rdx
    .cfi_restore %rsi
    .cfi_restore %rdi
    .cfi_restore %r8
    .cfi_restore %r9
    .cfi_restore %r10
    .cfi_restore %r11
.endm

/* Start stub \name, entered by the CPU with its frame (RIP CS RFLAGS RSP SS) at
 * rsp + \cfa - 40: CFI for a signal frame whose rip and rsp the CPU saved. */
.macro STUB_START name, cfa=40
    .globl \name
    .type \name, @function
\name:
    .cfi_startproc simple
    .cfi_signal_frame
    .cfi_def_cfa %rsp, \cfa
    .cfi_offset %rip, -40
    .cfi_offset %rsp, -16
.endm

.macro STUB_END name
    .cfi_endproc
    .size \name, . - \name
.endm

/* Before a stub calls C: the rbp frame of the layout above, scratch registers saved,
 * the stack aligned for the call. */
.macro ENTER_C
    pushq %rbp
    .cfi_adjust_cfa_offset 8
    .cfi_offset %rbp, -48
    movq %rsp, %rbp
    .cfi_def_cfa_register %rbp       /* CFA = rbp + 48 from here on */
    SAVE_SCRATCH 48
    subq $8, %rsp                    /* 16-byte alignment for the call */
    cld
.endm

/* After the C call: undo ENTER_C and return from the interrupt. */
.macro LEAVE_C_AND_IRET
    addq $8, %rsp
    RESTORE_SCRATCH
    popq %rbp
    .cfi_def_cfa %rsp, 40
    .cfi_restore %rbp
    iretq
.endm

    .text
    .code64

/* ------------------------------------------------------------------ */
/* Timer (vector 0x20): PIT IRQ0 in the kernel workload; in the user
 * workload the LAPIC timer of every CPU (the C handler sends the LAPIC EOI;
 * the 8259 is masked, so the PIC EOI below is a no-op there). */
    STUB_START timer_irq_entry
    ENTER_C
    call timer_interrupt_handler
    movb $0x20, %al                  /* EOI to the master 8259 */
    outb %al, $0x20
    LEAVE_C_AND_IRET
    STUB_END timer_irq_entry

/* ------------------------------------------------------------------ */
/* Masked / spurious PIC interrupts (vectors 0x21-0x2f): ignore. */
    STUB_START irq_ignore_entry
    iretq
    STUB_END irq_ignore_entry

/* ------------------------------------------------------------------ */
/*
 * System calls (user workload): `int $0x80` from ring 3, IDT gate with DPL 3
 * (interrupt gate: interrupts stay off during the call). Number in rax,
 * arguments in rdi and rsi, result in rax; every other register is
 * preserved. Same frame and CFI as timer_irq_entry: the CPU switched to
 * TSS.RSP0 (the process's kernel stack) and pushed the user SS, RSP, RFLAGS,
 * CS, RIP, so the unwinder goes syscall_dispatch -> syscall_entry -> the user
 * function that executed `int $0x80` (RIP = the instruction after it).
 *
 * A 32-bit process in compatibility mode (workload=compat) reaches the same
 * gate the same way (the CPU enters 64-bit mode and pushes the same 64-bit
 * frame); the CS it pushed is then USER32_CS (L=0) instead of USER_CS, and
 * the call follows the i386 ABI: number in eax, arguments in ebx and ecx
 * (zero-extended), 64-bit result in edx:eax; every other register is
 * preserved. The same syscall_dispatch chain below, one exit: the iretq goes
 * back to compatibility mode with that CS.
 */
    STUB_START syscall_entry
    ENTER_C
    cmpq $USER32_CS, 16(%rbp)        /* the caller's CS, from the CPU's frame */
    je 1f
    movq %rsi, %rdx                  /* syscall_dispatch(nr, a1, a2) */
    movq %rdi, %rsi
    movq %rax, %rdi
    call syscall_dispatch
    movq %rax, -8(%rbp)              /* result replaces the saved rax */
    jmp 2f
1:  movl %ecx, %edx                  /* compat: syscall_dispatch(eax, ebx, ecx) */
    movl %ebx, %esi
    movl %eax, %edi
    call syscall_dispatch
    movq %rax, %rdx
    shrq $32, %rdx
    movq %rdx, -24(%rbp)             /* high half replaces the saved rdx */
    movl %eax, %eax
    movq %rax, -8(%rbp)              /* low half replaces the saved rax */
2:  LEAVE_C_AND_IRET
    STUB_END syscall_entry

/* ------------------------------------------------------------------ */
/* Reschedule IPI (user workload, RESCHED_VECTOR): sent to an idle CPU when
 * a process wakes up. The C handler sends the LAPIC EOI itself (before it
 * may switch to another context). Same frame and CFI as timer_irq_entry. */
    STUB_START resched_irq_entry
    ENTER_C
    call resched_interrupt_handler
    LEAVE_C_AND_IRET
    STUB_END resched_irq_entry

/* ------------------------------------------------------------------ */
/* CPU exceptions 0-31: report on serial and stop (exception_handler). */
.macro EXC_STUB vec, has_error
    STUB_START exc_stub_\vec, (40 + 8 * \has_error)
    .if \has_error == 0
    pushq $0
    .cfi_adjust_cfa_offset 8
    .endif
    pushq $\vec
    .cfi_adjust_cfa_offset 8
    jmp exception_common
    STUB_END exc_stub_\vec
.endm

EXC_STUB 0, 0
EXC_STUB 1, 0
EXC_STUB 2, 0
EXC_STUB 3, 0
EXC_STUB 4, 0
EXC_STUB 5, 0
EXC_STUB 6, 0
EXC_STUB 7, 0
EXC_STUB 8, 1
EXC_STUB 9, 0
EXC_STUB 10, 1
EXC_STUB 11, 1
EXC_STUB 12, 1
EXC_STUB 13, 1
EXC_STUB 14, 1
EXC_STUB 15, 0
EXC_STUB 16, 0
EXC_STUB 17, 1
EXC_STUB 18, 0
EXC_STUB 19, 0
EXC_STUB 20, 0
EXC_STUB 21, 1
EXC_STUB 22, 0
EXC_STUB 23, 0
EXC_STUB 24, 0
EXC_STUB 25, 0
EXC_STUB 26, 0
EXC_STUB 27, 0
EXC_STUB 28, 0
EXC_STUB 29, 1
EXC_STUB 30, 1
EXC_STUB 31, 0

/* Entered by jmp with [rsp] = vector, [rsp+8] = error code, then the
 * hardware frame: CFA = rsp + 56. */
    .type exception_common, @function
exception_common:
    .cfi_startproc simple
    .cfi_signal_frame
    .cfi_def_cfa %rsp, 56
    .cfi_offset %rip, -40
    .cfi_offset %rsp, -16
    pushq %rbp
    .cfi_adjust_cfa_offset 8
    .cfi_offset %rbp, -64
    movq %rsp, %rbp
    .cfi_def_cfa_register %rbp
    SAVE_SCRATCH 64
    cld
    movq %rsp, %rdi                  /* struct exception_frame * */
    andq $-16, %rsp
    call exception_handler           /* does not return */
1:  cli
    hlt
    jmp 1b
    .cfi_endproc
    .size exception_common, . - exception_common

    .section .rodata
    .balign 8
    .globl exception_stub_table
exception_stub_table:
    .irp v, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
    .quad exc_stub_\v
    .endr

    .section .note.GNU-stack, "", @progbits
