/*
 * qmpprof example guest, i386: boot code.
 *
 * kernel.elf is an ELF32 multiboot (v1) kernel: QEMU's multiboot loader
 * (qemu-system-i386 or qemu-system-x86_64 -kernel kernel.elf) loads its
 * PT_LOAD segments at their physical addresses (p_paddr, from 1 MiB) and
 * jumps to e_entry, the physical address of _start, in 32-bit protected
 * mode, paging off, EAX = 0x2BADB002, EBX = physical address of the
 * multiboot info.
 *
 * Everything is linked in the higher half (VMA = KERNEL_VMA + physical,
 * KERNEL_VMA = 0xC0000000, the 3G/1G split). Until paging is on, code runs
 * at its physical address, so every memory reference in _start goes through
 * PHYS().
 *
 * Paging mode, chosen here from the multiboot command line (QEMU -append):
 *   paging=pae  PAE (CR4.PAE): kernel_pdpt -> kernel_pd_pae, 2 MiB pages
 *   otherwise   2-level paging (CR4.PSE): kernel_pgdir, 4 MiB pages
 * (default; `paging=2level` says it explicitly). User processes get 4 KiB
 * pages in either mode (i386/mm.c).
 */
#include "config.h"

#define PHYS(x)        ((x) - KERNEL_VMA)
#define MB_MAGIC       0x1BADB002
#define MB_FLAGS       0x00000003   /* page-align modules | mem info (no a.out kludge: ELF) */
#define CR4_PSE        (1 << 4)
#define CR4_PAE        (1 << 5)

/* ------------------------------------------------------------------ */
    .section .multiboot, "a"
    .balign 4
multiboot_header:
    .long MB_MAGIC
    .long MB_FLAGS
    .long -(MB_MAGIC + MB_FLAGS)

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

    lgdt PHYS(gdt_ptr_phys)
    ljmp $KERNEL_CS, $PHYS(1f)
1:  movl $KERNEL_DS, %eax
    movl %eax, %ds
    movl %eax, %es
    movl %eax, %ss
    xorl %eax, %eax
    movl %eax, %fs
    movl %eax, %gs

    /* edx = 1 if the command line has a token "paging=pae" (tokens are
     * separated by spaces; QEMU passes "<kernel file> <-append string>") */
    xorl %edx, %edx
    cmpl $0x2BADB002, PHYS(boot_multiboot_magic)
    jne .Lmode_done
    movl PHYS(boot_multiboot_info), %ebx
    testl $4, (%ebx)                    /* flags: cmdline valid */
    jz .Lmode_done
    movl 16(%ebx), %esi                 /* cmdline, physical */
    movl %esi, %ebp                     /* its start */
.Lscan:
    cmpb $0, (%esi)
    je .Lmode_done
    cmpl %ebp, %esi
    je .Ltoken
    cmpb $' ', -1(%esi)
    jne .Lnext
.Ltoken:                                /* a token starts at esi */
    movl $PHYS(paging_pae_token), %edi
    movl %esi, %ecx
.Lcmp:
    movb (%edi), %al
    testb %al, %al
    jz .Lcmp_end
    cmpb %al, (%ecx)
    jne .Lnext
    incl %edi
    incl %ecx
    jmp .Lcmp
.Lcmp_end:                              /* prefix matched: must end the token */
    movb (%ecx), %al
    testb %al, %al
    jz .Lfound
    cmpb $' ', %al
    jne .Lnext
.Lfound:
    movl $1, %edx
.Lnext:
    incl %esi
    jmp .Lscan
.Lmode_done:
    movl %edx, PHYS(boot_paging_pae)

    /* CR4 bits of the mode, also for the AP trampoline (ap_tramp_cr4) */
    testl %edx, %edx
    jnz 2f
    movl $CR4_PSE, %ecx
    movl $PHYS(kernel_pgdir), %ebx
    jmp 3f
2:  movl $CR4_PAE, %ecx
    movl $PHYS(kernel_pdpt), %ebx
3:  movl %ecx, PHYS(ap_tramp_cr4)
    movl %cr4, %eax
    orl %ecx, %eax
    movl %eax, %cr4
    movl %ebx, %cr3

    /* CR0.PG | CR0.WP (PE is on): paging, still identity mapped here */
    movl %cr0, %eax
    orl $0x80010000, %eax
    movl %eax, %cr0

    movl $kernel_entry, %eax            /* to the higher half */
    jmp *%eax
    .size _start, . - _start

/* ------------------------------------------------------------------ */
/*
 * kernel_entry: first code running at its higher-half address.
 * ebp = 0 and `.cfi_undefined eip` make this the outermost frame, so
 * debugger and profiler backtraces end here cleanly.
 */
    .text
    .globl kernel_entry
    .type kernel_entry, @function
kernel_entry:
    .cfi_startproc
    .cfi_undefined eip
    lgdt gdt_ptr                        /* same GDT, at its virtual address */

    /* CPU 0 (BSP) stack: kernel_stacks[0] */
    movl $(kernel_stacks + KERNEL_STACK_SIZE), %esp
    xorl %ebp, %ebp

    /* drop the low identity map, it was only needed to get here */
    cmpl $0, boot_paging_pae
    jne 1f
    movl $0, kernel_pgdir               /* PDE 0: 0..4 MiB */
    jmp 2f
1:  movl $0, kernel_pdpt                /* PDPTE 0: 0..1 GiB */
    movl $0, kernel_pdpt + 4
2:  movl %cr3, %eax                     /* (PAE: reloads the PDPTEs) */
    movl %eax, %cr3

    call kernel_main
3:  cli
    hlt
    jmp 3b
    .cfi_endproc
    .size kernel_entry, . - kernel_entry

/* ------------------------------------------------------------------ */
    .section .rodata
paging_pae_token:
    .asciz "paging=pae"

    .data
    .globl boot_multiboot_magic, boot_multiboot_info, boot_paging_pae, gdt_ptr
    .balign 4
boot_multiboot_magic:   .long 0
boot_multiboot_info:    .long 0
boot_paging_pae:        .long 0         /* 0: 2-level paging, 1: PAE */

    .balign 16
gdt:
    .quad 0                             /* null */
    .quad 0x00cf9a000000ffff            /* 0x08: ring-0 code, 32-bit, flat */
    .quad 0x00cf92000000ffff            /* 0x10: ring-0 data, flat */
gdt_end:

    .balign 8
    .word 0
gdt_ptr_phys:                           /* used before paging: physical base */
    .word gdt_end - gdt - 1
    .long PHYS(gdt)
    .balign 8
    .word 0
gdt_ptr:                                /* used from the higher half */
    .word gdt_end - gdt - 1
    .long gdt

/*
 * Page tables, static. Both map physical 0..KERNEL_MAP_SIZE (512 MiB) at
 * KERNEL_VMA, and 0.. at 0 (identity, boot only: kernel_entry removes it).
 * i386/mm.c adds the LAPIC page (LAPIC_VIRT = LAPIC_PHYS, uncached) and
 * builds the processes' tables (kernel half shared, user half 4 KiB pages).
 */
    .balign 4096
    .globl kernel_pgdir
kernel_pgdir:                           /* 2-level: 1024 PDEs, 4 MiB pages (PS) */
    .long 0x00000083                    /* PDE 0: identity 0..4 MiB (boot only) */
    .fill (KERNEL_VMA >> 22) - 1, 4, 0
    .set pde_index, 0
    .rept KERNEL_MAP_SIZE >> 22
    .long (pde_index << 22) | 0x83      /* present | writable | 4 MiB page */
    .set pde_index, pde_index + 1
    .endr
    .fill 1024 - (KERNEL_VMA >> 22) - (KERNEL_MAP_SIZE >> 22), 4, 0

    .balign 4096
    .globl kernel_pd_pae
kernel_pd_pae:                          /* PAE: the page directory of 0xC0000000..4 GiB */
    .set pde_index, 0
    .rept KERNEL_MAP_SIZE >> 21
    .long (pde_index << 21) | 0x83, 0   /* present | writable | 2 MiB page */
    .set pde_index, pde_index + 1
    .endr
    .fill 512 - (KERNEL_MAP_SIZE >> 21), 8, 0

    .balign 4096
    .globl kernel_pdpt
kernel_pdpt:                            /* PAE: 4 PDPTEs (only P may be set) */
    .long PHYS(kernel_pd_pae) + 1, 0    /* 0: identity 0..1 GiB (boot only) */
    .long 0, 0
    .long 0, 0
    .long PHYS(kernel_pd_pae) + 1, 0    /* 3: kernel half, shared by every process */

    .section .note.GNU-stack, "", @progbits
