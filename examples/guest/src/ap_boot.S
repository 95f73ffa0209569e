/*
 * qmpprof example guest: application processor startup (user workload).
 *
 * ap_trampoline_start..ap_trampoline_end is copied to AP_TRAMPOLINE_PHYS
 * (0x8000, SIPI vector 8) by smp_start_aps(), which also fills in
 * ap_tramp_cr3 (a PML4 with the identity map and the kernel half),
 * ap_tramp_stack (top of kernel_stacks[id]) and ap_tramp_entry (ap_entry).
 * The AP starts in real mode at 0800:0000 and goes directly to long mode
 * (PAE, CR3, EFER.LME, then CR0.PE|PG at once, far jump to a 64-bit code
 * segment), then jumps to ap_entry in the higher half.
 */
#include "config.h"

#define TRAMP(x)    (AP_TRAMPOLINE_PHYS + ((x) - ap_trampoline_start))
#define OFF(x)      ((x) - ap_trampoline_start)

    .section .rodata.ap_trampoline, "a"
    .balign 16
    .globl ap_trampoline_start, ap_trampoline_end
    .globl ap_tramp_cr3, ap_tramp_stack, ap_tramp_entry
    .code16
ap_trampoline_start:
    cli
    cld
    movw %cs, %ax
    movw %ax, %ds
    lgdtl OFF(ap_tramp_gdt_ptr)
    movl %cr4, %eax
    orl $(1 << 5), %eax                 /* PAE */
    movl %eax, %cr4
    movl OFF(ap_tramp_cr3), %eax
    movl %eax, %cr3
    movl $0xC0000080, %ecx              /* EFER.LME */
    rdmsr
    orl $(1 << 8), %eax
    wrmsr
    movl %cr0, %eax
    orl $0x80010001, %eax               /* PG | WP | PE */
    movl %eax, %cr0
    ljmpl $KERNEL_CS, $TRAMP(ap_tramp64)

    .code64
ap_tramp64:
    movl $KERNEL_DS, %eax
    movl %eax, %ds
    movl %eax, %es
    movl %eax, %ss
    movq TRAMP(ap_tramp_stack), %rsp
    movq TRAMP(ap_tramp_entry), %rax
    jmp *%rax

    .balign 8
ap_tramp_gdt:
    .quad 0
    .quad 0x00af9a000000ffff            /* 0x08: 64-bit ring-0 code */
    .quad 0x00cf92000000ffff            /* 0x10: ring-0 data */
ap_tramp_gdt_ptr:
    .word ap_tramp_gdt_ptr - ap_tramp_gdt - 1
    .long TRAMP(ap_tramp_gdt)
    .balign 8
ap_tramp_cr3:   .quad 0
ap_tramp_stack: .quad 0
ap_tramp_entry: .quad 0
ap_trampoline_end:

/* ------------------------------------------------------------------ */
/*
 * ap_entry: first higher-half code of an AP, on its kernel stack.
 * Outermost frame of the AP's idle context: rbp = 0, `.cfi_undefined rip`.
 */
    .text
    .code64
    .globl ap_entry
    .type ap_entry, @function
ap_entry:
    .cfi_startproc
    .cfi_undefined rip
    lgdt gdt_ptr64(%rip)
    movl $KERNEL_DS, %eax
    movl %eax, %ds
    movl %eax, %es
    movl %eax, %ss
    xorl %eax, %eax
    movl %eax, %fs
    movl %eax, %gs
    /* leave the trampoline's page tables (identity map) for kernel_pml4 */
    leaq kernel_pml4(%rip), %rax
    movabsq $KERNEL_VMA, %rdx
    subq %rdx, %rax
    movq %rax, %cr3
    xorl %ebp, %ebp
    call ap_main
1:  cli
    hlt
    jmp 1b
    .cfi_endproc
    .size ap_entry, . - ap_entry

    .section .note.GNU-stack, "", @progbits
