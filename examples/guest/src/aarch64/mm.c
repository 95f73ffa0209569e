/* qmpprof example guest, AArch64 build: physical pages and the processes'
 * page tables (user workload only).
 *
 * The kernel half (TTBR1_EL1, boot.S) maps physical 0..2 GiB at KERNEL_VMA,
 * so every page of RAM is reachable at PHYS_TO_VIRT(phys). Pages come from a
 * bump allocator from PHYS_ALLOC_START (RAM + 4 MiB, above the kernel image)
 * to the end of RAM and are never freed.
 *
 * A process's address space is a 4-level table (L0..L3, 4 KiB pages) for
 * TTBR0_EL1 with its user pages only (the kernel is in TTBR1_EL1); its pages
 * are non-global (nG), tagged with the process's ASID. */
#include "proc.h"

static uint64_t phys_next;
static uint64_t phys_end;

void mm_init(uint64_t mem_start, uint64_t mem_end)
{
    extern char __kernel_end[];
    uint64_t kend = VIRT_TO_PHYS(__kernel_end);
    phys_next = PHYS_ALLOC_START;
    if (kend > phys_next)
        phys_next = (kend + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1);
    (void)mem_start;
    phys_end = mem_end;
    if (phys_end > 0x80000000)
        phys_end = 0x80000000;      /* only physical 0..2 GiB is mapped in the kernel half */
}

uint64_t alloc_page(void)
{
    if (phys_next + PAGE_SIZE > phys_end) {
        kprintf("qmpprof-guest: out of memory\n");
        for (;;)
            __asm__ volatile("msr daifset, #2; wfi");
    }
    uint64_t p = phys_next;
    phys_next += PAGE_SIZE;
    memset(PHYS_TO_VIRT(p), 0, PAGE_SIZE);
    return p;
}

uint64_t new_address_space(void)
{
    return alloc_page();
}

void map_page(uint64_t l0, uint64_t va, uint64_t pa, uint64_t flags)
{
    uint64_t *t = PHYS_TO_VIRT(l0 & PTE_ADDR);
    for (int shift = 39; shift > 12; shift -= 9) {
        uint64_t *e = &t[(va >> shift) & 511];
        if (!(*e & PTE_VALID))
            *e = alloc_page() | PTE_VALID | PTE_TABLE;
        t = PHYS_TO_VIRT(*e & PTE_ADDR);
    }
    t[(va >> 12) & 511] = (pa & PTE_ADDR) | PTE_VALID | PTE_TABLE | PTE_ATTR_NORMAL |
                          PTE_SH_INNER | PTE_AF | PTE_NG | flags;
}

uint64_t user_page_phys(uint64_t l0, uint64_t va)
{
    uint64_t *t = PHYS_TO_VIRT(l0 & PTE_ADDR);
    for (int shift = 39; shift >= 12; shift -= 9) {
        uint64_t e = t[(va >> shift) & 511];
        if (!(e & PTE_VALID))
            return 0;
        if (shift == 12)
            return e & PTE_ADDR;
        t = PHYS_TO_VIRT(e & PTE_ADDR);
    }
    return 0;
}
