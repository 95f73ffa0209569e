/*
 * qmpprof example guest, AArch64 build: boot.
 *
 * QEMU -M virt -kernel kernel.elf loads the PT_LOAD segments at their LMA
 * (0x40200000...) and starts CPU 0 at e_entry = _start_phys at EL1 with the
 * MMU off (no firmware: QEMU provides PSCI itself, conduit HVC). The other
 * CPUs stay powered off until PSCI CPU_ON starts them at secondary_start.
 *
 *   _start (physical)     zero .bss, mmu_setup, jump to kernel_entry
 *   mmu_setup (physical)  MAIR/TCR, TTBR0 = TTBR1 = kernel_l0, APIA key,
 *                         CNTKCTL_EL1, SCTLR_EL1 (MMU, caches, EnIA)
 *   kernel_entry          first upper-half code: VBAR_EL1, empty TTBR0 (the
 *                         boot identity map goes), sp = kernel_stacks[0] +
 *                         16 KiB, x29 = x30 = 0, bl kernel_main
 *   secondary_start       PSCI CPU_ON entry (physical, x0 = CPU number):
 *                         mmu_setup, jump to ap_entry
 *   ap_entry              same as kernel_entry on kernel_stacks[x0], bl ap_main
 *
 * Page tables (4 KiB granule, 48-bit VAs: T0SZ = T1SZ = 16): kernel_l0[0] ->
 * kernel_l1: [0] physical 0..1 GiB (devices: GIC, PL011) Device-nGnRE,
 * [1] physical 1..2 GiB (RAM) Normal WB, EL1 only, both 1 GiB blocks,
 * global. TTBR1_EL1 -> kernel_l0: virtual 0xffff000000000000 + phys. While
 * booting TTBR0_EL1 -> kernel_l0 as well (identity map); afterwards TTBR0_EL1
 * holds the running process's tables (ASID = pid) or empty_l0 (ASID 0).
 */
#include "config.h"

#define MAIR_VALUE  0xff04          /* attr0 Device-nGnRE, attr1 Normal WB RA WA */
/* T0SZ=16 IRGN0=ORGN0=WBWA SH0=inner TG0=4K T1SZ=16 IRGN1=ORGN1=WBWA SH1=inner
 * TG1=4K IPS=40 bits AS=16-bit ASIDs (A1=0: the ASID is TTBR0_EL1's) */
#define TCR_VALUE   0x12b5103510
/* RES1 bits | M C SA SA0 I nTWI nTWE | EnIA (pointer authentication, key A,
 * instruction addresses: PACIASP/AUTIASP sign for real, EL0 and EL1) */
#define SCTLR_VALUE 0xb0d5181d
/* The APIA key: fixed values, the same on every CPU (processes migrate). */
#define APIAKEY_LO  0x0123456789abcdef
#define APIAKEY_HI  0xfedcba9876543210
#define BLOCK_DEVICE 0x0060000000000401 /* block, attr0, AF, PXN, UXN */
#define BLOCK_NORMAL 0x0040000000000705 /* block, attr1, inner shareable, AF, UXN */

    .section .boot.text, "ax"
    .globl _start
    .type _start, %function
_start:
    msr daifset, #0xf
    adrp x0, __bss_start                /* PC-relative: physical addresses */
    add x0, x0, :lo12:__bss_start
    adrp x1, __bss_end
    add x1, x1, :lo12:__bss_end
1:  cmp x0, x1
    b.hs 2f
    stp xzr, xzr, [x0], #16
    b 1b
2:  bl mmu_setup
    ldr x0, =kernel_entry
    br x0
    .size _start, . - _start

/* Runs at the physical address, MMU off; returns with the MMU on (the
 * identity map in TTBR0_EL1 keeps the physical addresses valid). */
    .type mmu_setup, %function
mmu_setup:
    ldr x0, =MAIR_VALUE
    msr mair_el1, x0
    ldr x0, =TCR_VALUE
    msr tcr_el1, x0
    adrp x0, kernel_l0
    msr ttbr0_el1, x0
    msr ttbr1_el1, x0
    /* The key registers exist only where the CPU has pointer authentication
     * (ID_AA64ISAR1_EL1.APA/API, ID_AA64ISAR2_EL1.APA3): -cpu max,pauth=off has
     * none, and there PACIASP/AUTIASP are NOPs. */
    mrs x0, id_aa64isar1_el1
    ubfx x0, x0, #4, #8
    mrs x1, S3_0_C0_C6_2                /* ID_AA64ISAR2_EL1 */
    ubfx x1, x1, #12, #4
    orr x0, x0, x1
    cbz x0, 3f
    ldr x0, =APIAKEY_LO
    msr S3_0_C2_C1_0, x0                /* APIAKeyLo_EL1 */
    ldr x0, =APIAKEY_HI
    msr S3_0_C2_C1_1, x0                /* APIAKeyHi_EL1 */
3:
    mov x0, #2                          /* CNTKCTL_EL1.EL0VCTEN: EL0 reads CNTVCT_EL0 */
    msr cntkctl_el1, x0
    msr cpacr_el1, xzr                  /* FP/SIMD trapped: nothing uses it */
    isb
    tlbi vmalle1
    dsb nsh
    isb
    ldr x0, =SCTLR_VALUE
    msr sctlr_el1, x0
    isb
    ret
    .size mmu_setup, . - mmu_setup

/* PSCI CPU_ON entry of the other CPUs (physical, MMU off, x0 = CPU number). */
    .globl secondary_start
    .type secondary_start, %function
secondary_start:
    msr daifset, #0xf
    mov x19, x0
    bl mmu_setup
    mov x0, x19
    ldr x1, =ap_entry
    br x1
    .size secondary_start, . - secondary_start
    .ltorg

/* ---- upper half ---- */

/* VBAR_EL1, TTBR0_EL1 = empty_l0 (ASID 0), drop the boot identity map from
 * the TLB. Clobbers x1, x2. */
.macro enter_upper_half
    adrp x1, exception_vectors
    add x1, x1, :lo12:exception_vectors
    msr vbar_el1, x1
    adrp x1, empty_l0
    add x1, x1, :lo12:empty_l0
    ldr x2, =KERNEL_VMA
    sub x1, x1, x2
    msr ttbr0_el1, x1
    isb
    tlbi vmalle1
    dsb nsh
    isb
.endm

    .text
    .globl kernel_entry
    .type kernel_entry, %function
kernel_entry:
    .cfi_startproc
    .cfi_undefined x30                  /* outermost frame: backtraces end here */
    adrp x0, kernel_stacks
    add x0, x0, :lo12:kernel_stacks
    add x0, x0, #KERNEL_STACK_SIZE
    mov sp, x0
    enter_upper_half
    mov x29, #0
    mov x30, #0
    bl kernel_main
1:  wfi
    b 1b
    .cfi_endproc
    .size kernel_entry, . - kernel_entry

/* x0 = CPU number (PSCI context id) */
    .globl ap_entry
    .type ap_entry, %function
ap_entry:
    .cfi_startproc
    .cfi_undefined x30
    adrp x1, kernel_stacks
    add x1, x1, :lo12:kernel_stacks
    add x1, x1, x0, lsl #14             /* KERNEL_STACK_SIZE = 1 << 14 */
    add x1, x1, #KERNEL_STACK_SIZE
    mov sp, x1
    enter_upper_half
    mov x29, #0
    mov x30, #0
    bl ap_main
1:  wfi
    b 1b
    .cfi_endproc
    .size ap_entry, . - ap_entry
    .ltorg

/* ---- page tables ---- */
    .data
    .balign 4096
    .globl kernel_l0, kernel_l1
kernel_l0:
    .quad kernel_l1 - KERNEL_VMA + 3    /* table descriptor */
    .fill 511, 8, 0
kernel_l1:
    .quad 0x00000000 + BLOCK_DEVICE     /* physical 0..1 GiB: GIC, PL011, ... */
    .quad 0x40000000 + BLOCK_NORMAL     /* physical 1..2 GiB: RAM */
    .fill 510, 8, 0

    .bss
    .balign 4096
    .globl empty_l0
empty_l0:
    .fill 512, 8, 0

    .section .note.GNU-stack, "", %progbits
