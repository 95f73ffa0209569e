/*
 * qmpprof example guest, i386: context switch (user workload).
 *
 * A context is a kernel stack: a process's own (proc_kstacks[slot]) or a
 * CPU's idle context (kernel_stacks[cpu]). switch_context saves the
 * callee-saved registers on the current stack, stores esp, loads the new
 * one, loads the new CR3 (if different), clears prev->on_cpu (now nothing
 * runs on the old stack any more, another CPU may take it), restores the
 * new context's registers and returns into it.
 */
#include "config.h"

    .text

/* void switch_context(uintptr_t *save_ksp, uintptr_t new_ksp, uintptr_t new_cr3,
 *                     volatile uint32_t *prev_on_cpu);   (cdecl) */
    .globl switch_context
    .type switch_context, @function
switch_context:
    .cfi_startproc
    pushl %ebp
    .cfi_def_cfa_offset 8
    .cfi_offset %ebp, -8
    pushl %ebx
    .cfi_def_cfa_offset 12
    .cfi_offset %ebx, -12
    pushl %esi
    .cfi_def_cfa_offset 16
    .cfi_offset %esi, -16
    pushl %edi
    .cfi_def_cfa_offset 20
    .cfi_offset %edi, -20
    movl 20(%esp), %eax                 /* save_ksp */
    movl 24(%esp), %edx                 /* new_ksp */
    movl 28(%esp), %ecx                 /* new_cr3 */
    movl 32(%esp), %ebx                 /* prev_on_cpu */
    movl %esp, (%eax)
    movl %edx, %esp                     /* new context: same frame layout */
    movl %cr3, %eax
    cmpl %eax, %ecx
    je 1f
    movl %ecx, %cr3
1:  testl %ebx, %ebx
    jz 2f
    movl $0, (%ebx)                     /* prev->on_cpu = 0 */
2:  popl %edi
    .cfi_def_cfa_offset 16
    popl %esi
    .cfi_def_cfa_offset 12
    popl %ebx
    .cfi_def_cfa_offset 8
    popl %ebp
    .cfi_def_cfa_offset 4
    ret
    .cfi_endproc
    .size switch_context, . - switch_context

/*
 * First switch into a new process: switch_context "returns" here with esp
 * at the iret frame proc_create() built (user EIP = _start, CS = USER_CS,
 * EFLAGS = IF, ESP = USER_STACK_TOP, SS = USER_DS). Signal-frame CFI like
 * syscall_entry (CFA = esp + 12, eip at CFA-12, esp at CFA+0).
 */
    .globl proc_start_user
    .type proc_start_user, @function
proc_start_user:
    .cfi_startproc simple
    .cfi_signal_frame
    .cfi_def_cfa %esp, 12
    .cfi_offset %eip, -12
    .cfi_offset %esp, 0
    movl $USER_DS, %eax                 /* (the kernel runs with these already) */
    movl %eax, %ds
    movl %eax, %es
    xorl %eax, %eax
    xorl %ebx, %ebx
    xorl %ecx, %ecx
    xorl %edx, %edx
    xorl %esi, %esi
    xorl %edi, %edi
    xorl %ebp, %ebp
    iret
    .cfi_endproc
    .size proc_start_user, . - proc_start_user

    .section .note.GNU-stack, "", @progbits
