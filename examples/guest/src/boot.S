/*
 * qmpprof example guest: boot code.
 *
 * QEMU's multiboot (v1) loader starts us in 32-bit protected mode, paging
 * off, EAX = 0x2BADB002, EBX = physical address of the multiboot info.
 * The bootable image (kernel.boot) is a flat binary; the multiboot header
 * uses the "a.out kludge" address fields, so QEMU does not need to parse
 * an ELF (its multiboot loader refuses ELF64).
 *
 * Everything is linked in the higher half (VMA = KERNEL_VMA + physical).
 * Until paging is on, code runs at its physical address, so every memory
 * reference in the 32-bit part goes through PHYS().
 */
#include "config.h"

#define PHYS(x)        ((x) - KERNEL_VMA)
#define MB_MAGIC       0x1BADB002
#define MB_FLAGS       0x00010003   /* page-align modules | mem info | a.out kludge */

/* ------------------------------------------------------------------ */
    .section .multiboot, "a"
    .balign 4
multiboot_header:
    .long MB_MAGIC
    .long MB_FLAGS
    .long -(MB_MAGIC + MB_FLAGS)
    .long PHYS(multiboot_header)     /* header_addr */
    .long __kernel_load_start_phys   /* load_addr */
    .long __kernel_load_end_phys     /* load_end_addr (end of .data) */
    .long __kernel_bss_end_phys      /* bss_end_addr */
    .long PHYS(_start)               /* entry_addr */

/* ------------------------------------------------------------------ */
    .section .boot.text, "ax"
    .code32
    .globl _start
    .type _start, @function
_start:
    cli
    cld
    movl %eax, PHYS(boot_multiboot_magic)
    movl %ebx, PHYS(boot_multiboot_info)

    /* zero .bss (includes the per-CPU kernel stacks) */
    movl $__kernel_bss_start_phys, %edi
    movl $__kernel_bss_end_phys, %ecx
    subl %edi, %ecx
    xorl %eax, %eax
    rep stosb

    lgdt PHYS(gdt_ptr32)

    /* CR4.PAE */
    movl %cr4, %eax
    orl $(1 << 5), %eax
    movl %eax, %cr4

    movl $PHYS(kernel_pml4), %eax
    movl %eax, %cr3

    /* EFER.LME */
    movl $0xC0000080, %ecx
    rdmsr
    orl $(1 << 8), %eax
    wrmsr

    /* CR0.PG | CR0.WP | CR0.PE -> IA-32e compatibility mode */
    movl %cr0, %eax
    orl $0x80010001, %eax
    movl %eax, %cr0

    /* load the 64-bit code segment: now in 64-bit mode, still identity mapped */
    ljmp $KERNEL_CS, $PHYS(start64_low)

    .code64
start64_low:
    movabsq $kernel_entry, %rax
    jmp *%rax
    .size _start, . - _start

/* ------------------------------------------------------------------ */
/*
 * kernel_entry: first code running at its higher-half address.
 * rbp = 0 and `.cfi_undefined rip` make this the outermost frame, so
 * debugger and profiler backtraces end here cleanly.
 */
    .text
    .code64
    .globl kernel_entry
    .type kernel_entry, @function
kernel_entry:
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

    /* CPU 0 (BSP) stack: kernel_stacks[0] */
    movq $(kernel_stacks + KERNEL_STACK_SIZE), %rsp
    xorl %ebp, %ebp

    /* drop the low identity map, it was only needed to get here */
    movq $0, kernel_pml4(%rip)
    movq %cr3, %rax
    movq %rax, %cr3

    call kernel_main
1:  cli
    hlt
    jmp 1b
    .cfi_endproc
    .size kernel_entry, . - kernel_entry

/* ------------------------------------------------------------------ */
    .data
    .globl boot_multiboot_magic, boot_multiboot_info, gdt_ptr64
    .balign 4
boot_multiboot_magic:   .long 0
boot_multiboot_info:    .long 0

    .balign 16
gdt:
    .quad 0                          /* null */
    .quad 0x00af9a000000ffff         /* 0x08: 64-bit ring-0 code */
    .quad 0x00cf92000000ffff         /* 0x10: ring-0 data */
gdt_end:

    .balign 8
    .word 0
gdt_ptr32:                           /* used before paging: physical base */
    .word gdt_end - gdt - 1
    .long PHYS(gdt)
    .balign 8
    .word 0,0,0
gdt_ptr64:                           /* used from the higher half */
    .word gdt_end - gdt - 1
    .quad gdt

/*
 * Page tables, static: 2 MiB pages for physical 0..1 GiB, mapped both at 0
 * (identity, boot only; entry 0 is cleared in kernel_entry) and at
 * KERNEL_VMA (PML4[511] -> PDPT[510]).
 */
    .balign 4096
    .globl kernel_pml4
kernel_pml4:
    .quad PHYS(boot_pdpt_low) + 0x3
    .fill 510, 8, 0
    .quad PHYS(kernel_pdpt_high) + 0x3
    .globl boot_pdpt_low, kernel_pdpt_high
boot_pdpt_low:
    .quad PHYS(kernel_pd) + 0x3
    .fill 511, 8, 0
kernel_pdpt_high:
    .fill 510, 8, 0
    .quad PHYS(kernel_pd) + 0x3
    .quad 0
kernel_pd:
    .set pd_index, 0
    .rept 512
    .quad (pd_index << 21) | 0x83    /* present | writable | 2 MiB page */
    .set pd_index, pd_index + 1
    .endr

    .section .note.GNU-stack, "", @progbits
