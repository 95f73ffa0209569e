/*
 * qmpprof example guest, i386: application processor startup (user workload).
 *
 * ap_trampoline_start..ap_trampoline_end is copied to AP_TRAMPOLINE_PHYS
 * (0x8000, SIPI vector 8) by smp_start_aps(), which also fills in
 * ap_tramp_cr3 (ap_boot_pml4(): a page directory / PDPT with the identity
 * map and the kernel half), ap_tramp_stack (top of kernel_stacks[id]) and
 * ap_tramp_entry (ap_entry); boot.S stored the CR4 paging bits of the boot's
 * paging mode (PSE for 2-level, PAE) in ap_tramp_cr4. The AP starts in real
 * mode at 0800:0000 and goes directly to protected mode with paging (CR4,
 * CR3, then CR0.PE|PG at once, far jump to a 32-bit code segment), then
 * jumps to ap_entry in the higher half. No long mode.
 */
#include "config.h"

#define TRAMP(x)    (AP_TRAMPOLINE_PHYS + ((x) - ap_trampoline_start))
#define OFF(x)      ((x) - ap_trampoline_start)

    .section .data.ap_trampoline, "aw"  /* writable: boot.S sets ap_tramp_cr4 */
    .balign 16
    .globl ap_trampoline_start, ap_trampoline_end
    .globl ap_tramp_cr3, ap_tramp_stack, ap_tramp_entry, ap_tramp_cr4
    .code16
ap_trampoline_start:
    cli
    cld
    movw %cs, %ax
    movw %ax, %ds
    lgdtl OFF(ap_tramp_gdt_ptr)
    movl %cr4, %eax
    orl OFF(ap_tramp_cr4), %eax         /* PSE or PAE */
    movl %eax, %cr4
    movl OFF(ap_tramp_cr3), %eax
    movl %eax, %cr3
    movl %cr0, %eax
    orl $0x80010001, %eax               /* PG | WP | PE */
    movl %eax, %cr0
    ljmpl $KERNEL_CS, $TRAMP(ap_tramp32)

    .code32
ap_tramp32:
    movl $KERNEL_DS, %eax
    movl %eax, %ds
    movl %eax, %es
    movl %eax, %ss
    movl TRAMP(ap_tramp_stack), %esp
    movl TRAMP(ap_tramp_entry), %eax
    jmp *%eax

    .balign 8
ap_tramp_gdt:
    .quad 0
    .quad 0x00cf9a000000ffff            /* 0x08: ring-0 code, 32-bit */
    .quad 0x00cf92000000ffff            /* 0x10: ring-0 data */
ap_tramp_gdt_ptr:
    .word ap_tramp_gdt_ptr - ap_tramp_gdt - 1
    .long TRAMP(ap_tramp_gdt)
    .balign 8
ap_tramp_cr3:   .quad 0                 /* 64-bit fields (smp.c is shared), low half used */
ap_tramp_stack: .quad 0
ap_tramp_entry: .quad 0
ap_tramp_cr4:   .long 0
ap_trampoline_end:

/* ------------------------------------------------------------------ */
/*
 * ap_entry: first higher-half code of an AP, on its kernel stack.
 * Outermost frame of the AP's idle context: ebp = 0, `.cfi_undefined eip`.
 */
    .text
    .globl ap_entry
    .type ap_entry, @function
ap_entry:
    .cfi_startproc
    .cfi_undefined eip
    lgdt gdt_ptr
    movl $KERNEL_DS, %eax
    movl %eax, %ds
    movl %eax, %es
    movl %eax, %ss
    xorl %eax, %eax
    movl %eax, %fs
    movl %eax, %gs
    /* leave the trampoline's page tables (identity map) for the kernel's */
    movl kernel_cr3, %eax
    movl %eax, %cr3
    xorl %ebp, %ebp
    call ap_main
1:  cli
    hlt
    jmp 1b
    .cfi_endproc
    .size ap_entry, . - ap_entry

    .section .note.GNU-stack, "", @progbits
