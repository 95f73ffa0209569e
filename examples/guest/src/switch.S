/*
 * qmpprof example guest: context switch (user workload).
 *
 * A context is a kernel stack: a process's own (proc_kstacks[slot]) or a
 * CPU's idle context (kernel_stacks[cpu]). switch_context saves the
 * callee-saved registers on the current stack, stores rsp, loads the new
 * one, loads the new CR3 (if different), clears prev->on_cpu (now nothing
 * runs on the old stack any more, another CPU may take it), restores the
 * new context's registers and returns into it.
 */
#include "config.h"

    .text
    .code64

/* void switch_context(uint64_t *save_ksp, uint64_t new_ksp, uint64_t new_cr3,
 *                     volatile uint32_t *prev_on_cpu); */
    .globl switch_context
    .type switch_context, @function
switch_context:
    .cfi_startproc
    pushq %rbp
    .cfi_def_cfa_offset 16
    .cfi_offset %rbp, -16
    pushq %rbx
    .cfi_def_cfa_offset 24
    .cfi_offset %rbx, -24
    pushq %r12
    .cfi_def_cfa_offset 32
    .cfi_offset %r12, -32
    pushq %r13
    .cfi_def_cfa_offset 40
    .cfi_offset %r13, -40
    pushq %r14
    .cfi_def_cfa_offset 48
    .cfi_offset %r14, -48
    pushq %r15
    .cfi_def_cfa_offset 56
    .cfi_offset %r15, -56
    movq %rsp, (%rdi)
    movq %rsi, %rsp                  /* new context: same frame layout */
    movq %cr3, %rax
    cmpq %rax, %rdx
    je 1f
    movq %rdx, %cr3
1:  testq %rcx, %rcx
    jz 2f
    movl $0, (%rcx)                  /* prev->on_cpu = 0 */
2:  popq %r15
    .cfi_def_cfa_offset 48
    popq %r14
    .cfi_def_cfa_offset 40
    popq %r13
    .cfi_def_cfa_offset 32
    popq %r12
    .cfi_def_cfa_offset 24
    popq %rbx
    .cfi_def_cfa_offset 16
    popq %rbp
    .cfi_def_cfa_offset 8
    ret
    .cfi_endproc
    .size switch_context, . - switch_context

/*
 * First switch into a new process: switch_context "returns" here with rsp
 * at the iret frame proc_create() built (user RIP = _start, CS = USER_CS,
 * RFLAGS = IF, RSP = USER_STACK_TOP, SS = USER_DS). Same CFI as the
 * interrupt stubs (signal frame, CFA = rsp + 40).
 */
    .globl proc_start_user
    .type proc_start_user, @function
proc_start_user:
    .cfi_startproc simple
    .cfi_signal_frame
    .cfi_def_cfa %rsp, 40
    .cfi_offset %rip, -40
    .cfi_offset %rsp, -16
    xorl %eax, %eax
    xorl %ebx, %ebx
    xorl %ecx, %ecx
    xorl %edx, %edx
    xorl %esi, %esi
    xorl %edi, %edi
    xorl %ebp, %ebp
    xorl %r8d, %r8d
    xorl %r9d, %r9d
    xorl %r10d, %r10d
    xorl %r11d, %r11d
    xorl %r12d, %r12d
    xorl %r13d, %r13d
    xorl %r14d, %r14d
    xorl %r15d, %r15d
    iretq
    .cfi_endproc
    .size proc_start_user, . - proc_start_user

    .section .note.GNU-stack, "", @progbits
