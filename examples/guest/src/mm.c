/* qmpprof example guest: physical pages and page tables (user workload only).
 *
 * Physical memory 0..1 GiB is mapped at KERNEL_VMA by boot.S (2 MiB pages),
 * so every physical page is reachable at PHYS_TO_VIRT(phys). Pages are
 * handed out by a bump allocator from PHYS_ALLOC_START (4 MiB, above the
 * kernel image and QEMU's multiboot data) and never freed.
 *
 * Each process has its own PML4 whose upper half (entries 256-511) is a copy
 * of kernel_pml4's, so the kernel is mapped identically in every address
 * space; the lower half holds the process's 4 KiB user pages (PTE_U). */
#include "proc.h"

static uint64_t phys_next;
static uint64_t phys_end;

/* Page directory for PDPT[511] of the kernel half: the LAPIC MMIO page. */
static uint64_t lapic_pd[512] __attribute__((aligned(4096)));

void mm_init(uint64_t mem_end)
{
    extern char __kernel_end[];
    uint64_t kend = VIRT_TO_PHYS(__kernel_end);
    phys_next = PHYS_ALLOC_START;
    if (kend > phys_next)
        phys_next = (kend + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1);
    phys_end = mem_end;
    if (phys_end > 0x40000000)
        phys_end = 0x40000000;      /* only 1 GiB is mapped in the kernel half */
}

uint64_t alloc_page(void)
{
    if (phys_next + PAGE_SIZE > phys_end) {
        kprintf("qmpprof-guest: out of memory\n");
        for (;;)
            __asm__ volatile("cli; hlt");
    }
    uint64_t p = phys_next;
    phys_next += PAGE_SIZE;
    memset(PHYS_TO_VIRT(p), 0, PAGE_SIZE);
    return p;
}

uint64_t new_address_space(void)
{
    uint64_t pml4 = alloc_page();
    uint64_t *t = PHYS_TO_VIRT(pml4);
    for (int i = 256; i < 512; i++)
        t[i] = kernel_pml4[i];
    return pml4;
}

void map_page(uint64_t pml4, uint64_t va, uint64_t pa, uint64_t flags)
{
    uint64_t *t = PHYS_TO_VIRT(pml4);
    for (int shift = 39; shift > 12; shift -= 9) {
        uint64_t *e = &t[(va >> shift) & 511];
        if (!(*e & PTE_P))
            *e = alloc_page() | PTE_P | PTE_W | PTE_U;
        t = PHYS_TO_VIRT(*e & PTE_ADDR);
    }
    t[(va >> 12) & 511] = (pa & PTE_ADDR) | flags;
}

uint64_t user_page_phys(uint64_t pml4, uint64_t va)
{
    uint64_t *t = PHYS_TO_VIRT(pml4);
    for (int shift = 39; shift >= 12; shift -= 9) {
        uint64_t e = t[(va >> shift) & 511];
        if (!(e & PTE_P))
            return 0;
        if (shift == 12)
            return e & PTE_ADDR;
        t = PHYS_TO_VIRT(e & PTE_ADDR);
    }
    return 0;
}

/* LAPIC registers at LAPIC_VIRT: one uncached 2 MiB page (0xfee00000 is
 * 2 MiB aligned) in PDPT[511] of the kernel half, shared by all processes. */
void map_lapic(void)
{
    lapic_pd[0] = LAPIC_PHYS | PTE_P | PTE_W | PTE_PS | PTE_PCD | PTE_PWT;
    kernel_pdpt_high[511] = VIRT_TO_PHYS(lapic_pd) | PTE_P | PTE_W;
    __asm__ volatile("invlpg (%0)" : : "r"(LAPIC_VIRT) : "memory");
}

/* Page tables for the AP trampoline: it turns paging on while running at a
 * low physical address, so it needs the identity map (boot_pdpt_low, still
 * intact: kernel_entry only cleared kernel_pml4[0]) next to the kernel half. */
uint64_t ap_boot_pml4(void)
{
    uint64_t pml4 = new_address_space();
    uint64_t *t = PHYS_TO_VIRT(pml4);
    t[0] = VIRT_TO_PHYS(boot_pdpt_low) | PTE_P | PTE_W;
    return pml4;
}
