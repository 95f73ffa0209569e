/* qmpprof example guest, i386: physical pages and page tables (user workload),
 * in the paging mode boot.S chose (boot_paging_pae).
 *
 * Physical memory 0..KERNEL_MAP_SIZE (512 MiB) is mapped at KERNEL_VMA
 * (0xC0000000) by boot.S, so every physical page is reachable at
 * PHYS_TO_VIRT(phys). Pages are handed out by a bump allocator from
 * PHYS_ALLOC_START (4 MiB, above the kernel image and QEMU's multiboot data)
 * and never freed.
 *
 * Every process has its own top-level table (its cr3):
 *   2-level: a page directory (1024 x 4 bytes); PDEs 768-1023 (the kernel
 *            half, 0xC0000000 up, 4 MiB pages) copied from kernel_pgdir, user
 *            PDEs -> page tables of 4 KiB pages (PTE_U).
 *   PAE:     a PDPT (4 x 8 bytes, in a page of its own); PDPTE 3 (the kernel
 *            half) = kernel_pdpt[3], the shared kernel_pd_pae (2 MiB pages);
 *            PDPTEs 0-2 -> page directories -> page tables of 4 KiB pages.
 * The user half is everything below 0xC0000000. */
#include "proc.h"

#define CR4_PAE         (1u << 5)
#define PDE32_ADDR      0xfffff000u             /* 2-level: PDE -> page table, PTE -> page */
#define PAE_ADDR        0x000ffffffffff000ULL   /* PAE: any table entry */
#define KERNEL_PDE0     (KERNEL_VMA >> 22)      /* 2-level: first kernel PDE, 768 */

static uint64_t phys_next;
static uint64_t phys_end;

void paging_report(void)
{
    uint32_t cr4;
    __asm__ volatile("mov %%cr4, %0" : "=r"(cr4));
    /* boot.S only looks for "paging=pae"; say so if another value was asked for */
    for (const char *t = boot_cmdline; *t;) {
        while (*t == ' ')
            t++;
        int len = 0;
        while (t[len] && t[len] != ' ')
            len++;
        static const char key[] = "paging=";
        int i = 0;
        while (i < 7 && i < len && t[i] == key[i])
            i++;
        if (i == 7) {
            const char *v = t + 7;
            int vl = len - 7;
            int known = (vl == 3 && v[0] == 'p' && v[1] == 'a' && v[2] == 'e') ||
                        (vl == 6 && v[0] == '2' && v[1] == 'l' && v[2] == 'e' &&
                         v[3] == 'v' && v[4] == 'e' && v[5] == 'l');
            if (!known)
                kprintf("qmpprof-guest: unknown paging mode in '%s', using 2level\n",
                        boot_cmdline);
        }
        t += len;
    }
    kprintf("qmpprof-guest: paging %s\n", (cr4 & CR4_PAE) ? "pae" : "2level");
}

void mm_init(uint64_t mem_end)
{
    extern char __kernel_end[];
    uint64_t kend = VIRT_TO_PHYS(__kernel_end);
    phys_next = PHYS_ALLOC_START;
    if (kend > phys_next)
        phys_next = (kend + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1);
    phys_end = mem_end;
    if (phys_end > KERNEL_MAP_SIZE)
        phys_end = KERNEL_MAP_SIZE;     /* only this much is mapped in the kernel half */
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

/* A new top-level table (page directory or PDPT) sharing the kernel half. */
uint64_t new_address_space(void)
{
    uint64_t top = alloc_page();
    if (boot_paging_pae) {
        uint64_t *pdpt = PHYS_TO_VIRT(top);
        pdpt[3] = kernel_pdpt[3];
    } else {
        uint32_t *pd = PHYS_TO_VIRT(top);
        for (int i = KERNEL_PDE0; i < 1024; i++)
            pd[i] = kernel_pgdir[i];
    }
    return top;
}

void map_page(uint64_t root, uint64_t va, uint64_t pa, uint64_t flags)
{
    if (boot_paging_pae) {
        uint64_t *pdpt = PHYS_TO_VIRT(root);
        uint64_t *e = &pdpt[(va >> 30) & 3];
        if (!(*e & PTE_P))
            *e = alloc_page() | PTE_P;  /* PDPTE: bits 1 and 2 are reserved */
        uint64_t *pd = PHYS_TO_VIRT(*e & PAE_ADDR);
        e = &pd[(va >> 21) & 511];
        if (!(*e & PTE_P))
            *e = alloc_page() | PTE_P | PTE_W | PTE_U;
        uint64_t *pt = PHYS_TO_VIRT(*e & PAE_ADDR);
        pt[(va >> 12) & 511] = (pa & PAE_ADDR) | flags;
    } else {
        uint32_t *pd = PHYS_TO_VIRT(root);
        uint32_t *e = &pd[(va >> 22) & 1023];
        if (!(*e & PTE_P))
            *e = (uint32_t)alloc_page() | PTE_P | PTE_W | PTE_U;
        uint32_t *pt = PHYS_TO_VIRT(*e & PDE32_ADDR);
        pt[(va >> 12) & 1023] = ((uint32_t)pa & PDE32_ADDR) | (uint32_t)flags;
    }
}

uint64_t user_page_phys(uint64_t root, uint64_t va)
{
    if (boot_paging_pae) {
        uint64_t e = ((uint64_t *)PHYS_TO_VIRT(root))[(va >> 30) & 3];
        if (!(e & PTE_P))
            return 0;
        e = ((uint64_t *)PHYS_TO_VIRT(e & PAE_ADDR))[(va >> 21) & 511];
        if (!(e & PTE_P))
            return 0;
        e = ((uint64_t *)PHYS_TO_VIRT(e & PAE_ADDR))[(va >> 12) & 511];
        return (e & PTE_P) ? (e & PAE_ADDR) : 0;
    }
    uint32_t e = ((uint32_t *)PHYS_TO_VIRT(root))[(va >> 22) & 1023];
    if (!(e & PTE_P))
        return 0;
    e = ((uint32_t *)PHYS_TO_VIRT(e & PDE32_ADDR))[(va >> 12) & 1023];
    return (e & PTE_P) ? (e & PDE32_ADDR) : 0;
}

/* LAPIC registers at LAPIC_VIRT = LAPIC_PHYS (0xfee00000, in the kernel
 * half): one uncached large page, 4 MiB at 0xfec00000 (2-level: PDE 1019 of
 * kernel_pgdir, copied into every address space created later) or 2 MiB at
 * 0xfee00000 (PAE: entry 503 of the shared kernel_pd_pae). Called before the
 * processes and the APs' page tables are created. */
void map_lapic(void)
{
    if (boot_paging_pae)
        kernel_pd_pae[(LAPIC_VIRT - KERNEL_VMA) >> 21] =
            LAPIC_PHYS | PTE_P | PTE_W | PTE_PS | PTE_PCD | PTE_PWT;
    else
        kernel_pgdir[LAPIC_VIRT >> 22] =
            (LAPIC_PHYS & 0xffc00000u) | PTE_P | PTE_W | PTE_PS | PTE_PCD | PTE_PWT;
    __asm__ volatile("invlpg (%0)" : : "r"(LAPIC_VIRT) : "memory");
}

/* Page tables for the AP trampoline: it turns paging on while running at a
 * low physical address, so it needs an identity map next to the kernel half:
 * 2-level: PDE 0 = a 4 MiB page at 0; PAE: PDPTE 0 = kernel_pd_pae (which
 * maps physical 0..512 MiB from its first entry, so at VA 0 too). */
uint64_t ap_boot_pml4(void)
{
    uint64_t top = new_address_space();
    if (boot_paging_pae)
        ((uint64_t *)PHYS_TO_VIRT(top))[0] = kernel_pdpt[3];
    else
        ((uint32_t *)PHYS_TO_VIRT(top))[0] = 0 | PTE_P | PTE_W | PTE_PS;
    return top;
}
