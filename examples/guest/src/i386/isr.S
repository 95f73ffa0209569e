/*
 * qmpprof example guest, i386: interrupt entry stubs.
 *
 * A 32-bit interrupt frame has the interrupted ESP and SS only when the
 * privilege level changed (from ring 3: the CPU switched to TSS.ESP0 first).
 * From ring 0 the CPU pushes EIP, CS, EFLAGS on the interrupted stack itself,
 * and the interrupted ESP is the address just above them. Every stub
 * therefore stores the interrupted ESP, computed for either case, in a slot
 * of its own frame. Frame layout after ENTER_C (IRQ stubs):
 *
 *     ebp+20  SS          \  pushed by the CPU
 *     ebp+16  ESP          | only when it came from ring 3
 *     ebp+12  EFLAGS      <   CFA = ebp+16 (entry ESP + 12, just above EFLAGS)
 *     ebp+8   CS           |
 *     ebp+4   EIP         /   <- interrupted EIP
 *     ebp+0   saved EBP       <- interrupted EBP
 *     ebp-4   interrupted ESP (ring 0: ebp+16, ring 3: [ebp+16])
 *     ebp-8   EAX
 *     ebp-12  ECX
 *     ebp-16  EDX
 *
 * so a frame-pointer walk from the C handler goes handler -> stub ->
 * interrupted function -> its callers (the same as on x86-64), and the CFI
 * (a signal frame) gives GDB and DWARF unwinders everything:
 *
 *   CFA = esp + 12 at the first instruction (entry ESP + 12), ebp + 16 after
 *         `mov %esp,%ebp`: the address just above the EFLAGS word, for an
 *         interrupt from ring 0 exactly the interrupted ESP
 *   eip   at CFA-12 (the interrupted EIP, exact: no "return address - 1")
 *   esp   until the stub has stored its slot (and again after it dropped it):
 *         DW_CFA_val_expression  (CS & 3) ? [CFA] : CFA  (CS at CFA-8);
 *         in between: saved at CFA-20 (the slot at ebp-4), a plain offset
 *         rule. syscall_entry (only ever entered from ring 3) and
 *         proc_start_user use "saved at CFA+0" (the ESP the CPU pushed)
 *         instead of the expression.
 *   ebp   at CFA-16; eax, ecx, edx at CFA-24, -28, -32 (the scratch
 *         registers the stub saves; the C handler saves the others itself)
 *
 * DWARF register numbers (i386): eax 0, ecx 1, edx 2, ebx 3, esp 4, ebp 5,
 * esi 6, edi 7, eip 8.
 */
#include "config.h"

/* esp = (CS & 3) ? [CFA] : CFA, as DW_CFA_val_expression (0x16) for register
 * 4 (esp), 13 bytes; the CFA is pushed before the expression runs:
 *   DW_OP_dup, DW_OP_lit8, DW_OP_minus, DW_OP_deref   CFA, CS
 *   DW_OP_lit3, DW_OP_and, DW_OP_bra +3               CFA       (CS & 3 != 0: to the deref)
 *   DW_OP_skip +1                                     CFA       (ring 0: result CFA)
 *   DW_OP_deref                                       [CFA]     (ring 3: the pushed ESP) */
#define CFI_ESP_FROM_HW_FRAME \
    .cfi_escape 0x16, 0x04, 0x0d, 0x12, 0x38, 0x1c, 0x06, 0x33, 0x1a, 0x28, 0x03, 0x00, 0x2f, 0x01, 0x00, 0x06

/* The interrupted ESP rule while the stub's slot does not hold it.
 * user=1: the stub is only entered from ring 3, the CPU-pushed ESP at CFA+0. */
.macro CFI_ESP_HW user=0
    .if \user
    .cfi_offset %esp, 0
    .else
    CFI_ESP_FROM_HW_FRAME
    .endif
.endm

/* Start stub \name, entered by the CPU with EIP, CS, EFLAGS (and from ring 3
 * ESP, SS) at esp + \cfa - 12: CFI of a signal frame. */
.macro STUB_START name, cfa=12, user=0
    .globl \name
    .type \name, @function
\name:
    .cfi_startproc simple
    .cfi_signal_frame
    .cfi_def_cfa %esp, \cfa
    .cfi_offset %eip, -12
    CFI_ESP_HW \user
.endm

.macro STUB_END name
    .cfi_endproc
    .size \name, . - \name
.endm

/* Before a stub calls C: the ebp frame of the layout above (\hw = offset of
 * the CPU's EIP from the new ebp: 4, or 12 in exception_common, which has the
 * vector and error code below it), the interrupted ESP in its slot, scratch
 * registers saved, the stack aligned to 16 bytes for the call. CFA = ebp +
 * \hw + 12 from `mov %esp,%ebp` on. */
.macro ENTER_C hw=4
    pushl %ebp
    .cfi_adjust_cfa_offset 4
    .cfi_offset %ebp, -(\hw + 12)
    movl %esp, %ebp
    .cfi_def_cfa_register %ebp
    subl $4, %esp                       /* ebp-4: the interrupted ESP, below */
    pushl %eax
    .cfi_offset %eax, -(\hw + 20)
    pushl %ecx
    .cfi_offset %ecx, -(\hw + 24)
    pushl %edx
    .cfi_offset %edx, -(\hw + 28)
    leal (\hw + 12)(%ebp), %eax         /* ring 0: the ESP before the interrupt */
    testb $3, (\hw + 4)(%ebp)           /* RPL of the interrupted CS */
    jz 1f
    movl (\hw + 12)(%ebp), %eax         /* ring 3: the ESP the CPU pushed */
1:  movl %eax, -4(%ebp)
    .cfi_offset %esp, -(\hw + 16)
    movl -8(%ebp), %eax                 /* eax as it was (syscall number) */
    andl $-16, %esp
    cld
.endm

/* After the C call: undo ENTER_C and return from the interrupt. */
.macro LEAVE_C_AND_IRET user=0
    leal -16(%ebp), %esp
    popl %edx
    popl %ecx
    popl %eax
    .cfi_restore %eax
    .cfi_restore %ecx
    .cfi_restore %edx
    addl $4, %esp                       /* drop the ESP slot */
    CFI_ESP_HW \user
    popl %ebp
    .cfi_def_cfa %esp, 12
    .cfi_restore %ebp
    iret
.endm

    .text

/* ------------------------------------------------------------------ */
/* Timer (vector 0x20): PIT IRQ0 in the kernel workload; in the user
 * workload the LAPIC timer of every CPU (the C handler sends the LAPIC EOI;
 * the 8259 is masked, so the PIC EOI below is a no-op there). */
    STUB_START timer_irq_entry
    ENTER_C
    call timer_interrupt_handler
    movb $0x20, %al                     /* EOI to the master 8259 */
    outb %al, $0x20
    LEAVE_C_AND_IRET
    STUB_END timer_irq_entry

/* ------------------------------------------------------------------ */
/* Masked / spurious PIC interrupts (vectors 0x21-0x2f), LAPIC spurious: ignore. */
    STUB_START irq_ignore_entry
    iret
    STUB_END irq_ignore_entry

/* ------------------------------------------------------------------ */
/*
 * System calls (user workload): `int $0x80` from ring 3, IDT gate with DPL 3
 * (interrupt gate: interrupts stay off during the call). Number in eax,
 * arguments in ebx and ecx, 64-bit result in edx:eax; every other register is
 * preserved. Same frame as timer_irq_entry: the CPU switched to TSS.ESP0 (the
 * process's kernel stack) and pushed the user SS, ESP, EFLAGS, CS, EIP, so
 * the unwinder goes syscall_dispatch -> syscall_entry -> the user function
 * that executed `int $0x80` (EIP = the instruction after it).
 * syscall_dispatch(uint64_t nr, uint64_t a1, uint64_t a2): cdecl, the
 * arguments zero-extended on the stack.
 */
    STUB_START syscall_entry, 12, 1
    ENTER_C
    subl $8, %esp                       /* 8 + 24 bytes of arguments: aligned call */
    pushl $0
    pushl %ecx                          /* a2 */
    pushl $0
    pushl %ebx                          /* a1 */
    pushl $0
    pushl %eax                          /* nr */
    call syscall_dispatch
    movl %eax, -8(%ebp)                 /* the result replaces the saved eax */
    movl %edx, -16(%ebp)                /* and edx */
    LEAVE_C_AND_IRET 1
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
    STUB_START exc_stub_\vec, (12 + 4 * \has_error)
    .if \has_error == 0
    pushl $0
    .cfi_adjust_cfa_offset 4
    .endif
    pushl $\vec
    .cfi_adjust_cfa_offset 4
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

/* Entered by jmp with [esp] = vector, [esp+4] = error code, then the
 * hardware frame: CFA = esp + 20. The C handler gets a struct
 * exception_frame * (kernel.h) = ebp - 16. */
    .type exception_common, @function
exception_common:
    .cfi_startproc simple
    .cfi_signal_frame
    .cfi_def_cfa %esp, 20
    .cfi_offset %eip, -12
    CFI_ESP_FROM_HW_FRAME
    ENTER_C 12
    leal -16(%ebp), %eax                /* struct exception_frame * */
    subl $12, %esp
    pushl %eax
    call exception_handler              /* does not return */
1:  cli
    hlt
    jmp 1b
    .cfi_endproc
    .size exception_common, . - exception_common

    .section .rodata
    .balign 4
    .globl exception_stub_table
exception_stub_table:
    .irp v, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
    .long exc_stub_\v
    .endr

    .section .note.GNU-stack, "", @progbits
