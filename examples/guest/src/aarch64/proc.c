/* qmpprof example guest, AArch64 build: processes of the user workload
 * (boot option workload=user) and the boot sequence that starts them.
 *
 * As src/proc.c: the user programs (user/NAME.c with user/aarch64/, static
 * non-PIE ELF64 AArch64 linked at 0x400000) are embedded in the kernel image
 * (user_blobs.S). proc_create() gives each process its own TTBR0_EL1 tables
 * (ASID = pid), copies the PT_LOAD segments into fresh pages mapped at
 * p_vaddr, maps a user stack below USER_STACK_TOP and a read-only struct
 * user_info page at USER_INFO_VA, and builds an initial kernel stack that
 * "returns" to EL0 at _start through proc_start_user (entry.S). */
#include "proc.h"

extern const uint8_t user_crunch_elf[], user_crunch_elf_end[];
extern const uint8_t user_pulse_elf[], user_pulse_elf_end[];

/* Kernel stacks of the processes (slot = pid - 1), aligned to their size. */
uint8_t proc_kstacks[NPROC][KERNEL_STACK_SIZE] __attribute__((aligned(KERNEL_STACK_SIZE)));
uint32_t nproc_created;

struct elf64_ehdr {
    uint8_t e_ident[16];
    uint16_t e_type, e_machine;
    uint32_t e_version;
    uint64_t e_entry, e_phoff, e_shoff;
    uint32_t e_flags;
    uint16_t e_ehsize, e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx;
};

struct elf64_phdr {
    uint32_t p_type, p_flags;
    uint64_t p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align;
};

#define ELFCLASS64  2
#define EM_AARCH64  183
#define ET_EXEC     2
#define PT_LOAD     1
#define PF_X        1
#define PF_W        2
#define USER64_VA_END 0x7ff000000000ULL

static __attribute__((noreturn)) void user_panic(const char *what)
{
    kprintf("qmpprof-guest: cannot create process: %s\n", what);
    for (;;)
        __asm__ volatile("msr daifset, #2; wfi");
}

/* Copy the PT_LOAD segments into new pages of address space `l0`; returns
 * the entry point. */
static uint64_t elf_load(uint64_t l0, const uint8_t *elf, uint64_t size)
{
    const struct elf64_ehdr *eh = (const struct elf64_ehdr *)elf;
    if (size < sizeof(*eh) || elf[0] != 0x7f || elf[1] != 'E' || elf[2] != 'L' ||
        elf[3] != 'F' || elf[4] != ELFCLASS64 || eh->e_machine != EM_AARCH64 ||
        eh->e_type != ET_EXEC)
        user_panic("not an AArch64 ELF64 executable");
    if (eh->e_phoff + (uint64_t)eh->e_phnum * eh->e_phentsize > size)
        user_panic("program headers out of range");
    for (unsigned i = 0; i < eh->e_phnum; i++) {
        const struct elf64_phdr *ph =
            (const struct elf64_phdr *)(elf + eh->e_phoff + (uint64_t)i * eh->e_phentsize);
        if (ph->p_type != PT_LOAD || ph->p_memsz == 0)
            continue;
        if (ph->p_offset + ph->p_filesz > size || ph->p_filesz > ph->p_memsz ||
            ph->p_vaddr < 0x1000 || ph->p_vaddr + ph->p_memsz > USER64_VA_END)
            user_panic("bad PT_LOAD segment");
        uint64_t flags = (ph->p_flags & PF_W) ? PTE_USER_RW
                         : (ph->p_flags & PF_X) ? PTE_USER_RX : PTE_USER_RO;
        uint64_t end = ph->p_vaddr + ph->p_memsz;
        for (uint64_t va = ph->p_vaddr & ~(PAGE_SIZE - 1); va < end; va += PAGE_SIZE) {
            uint64_t pa = user_page_phys(l0, va);
            if (!pa)
                map_page(l0, va, alloc_page(), flags);
            else if (flags == PTE_USER_RW)      /* page shared with the previous segment */
                map_page(l0, va, pa, flags);
        }
        for (uint64_t off = 0; off < ph->p_filesz;) {
            uint64_t va = ph->p_vaddr + off;
            uint64_t in_page = va & (PAGE_SIZE - 1);
            uint64_t n = PAGE_SIZE - in_page;
            if (n > ph->p_filesz - off)
                n = ph->p_filesz - off;
            uint8_t *dst = (uint8_t *)PHYS_TO_VIRT(user_page_phys(l0, va)) + in_page;
            memcpy(dst, elf + ph->p_offset + off, n);
            off += n;
        }
    }
    /* The code was written through the kernel's data mapping: make it visible
     * to instruction fetches (clean to PoU, invalidate the I-cache). */
    __asm__ volatile("dsb ish; ic ialluis; dsb ish; isb" ::: "memory");
    return eh->e_entry;
}

struct process *proc_create(int pid, const char *name, const uint8_t *elf, uint64_t size)
{
    struct process *p = &process_table[pid - 1];
    p->pid = pid;
    for (int i = 0; i < (int)sizeof(p->name) - 1 && name[i]; i++)
        p->name[i] = name[i];
    p->cpu = -1;
    uint64_t l0 = new_address_space();
    p->cr3 = l0 | ((uint64_t)pid << TTBR_ASID_SHIFT);
    p->entry = elf_load(l0, elf, size);

    for (uint64_t i = 0; i < USER_STACK_PAGES; i++)
        map_page(l0, USER_STACK_TOP - (i + 1) * PAGE_SIZE, alloc_page(), PTE_USER_RW);
    p->user_stack_top = USER_STACK_TOP;

    uint64_t info = alloc_page();
    map_page(l0, USER_INFO_VA, info, PTE_USER_RO);       /* read-only for EL0 */
    p->info = PHYS_TO_VIRT(info);
    p->info->pid = pid;
    p->info->ncpu = (int32_t)ncpus;
    p->info->tsc_per_ms = tsc_per_ms;
    p->info->hz = TIMER_HZ;
    p->info->ticks = timer_ticks;

    /* Initial kernel stack: an exception frame that returns to EL0 at
     * _start (pstate 0 = EL0t, interrupts unmasked, sp = user stack top,
     * every register 0), below it a switch_context frame whose x30 is
     * proc_start_user. */
    p->kstack_top = (uintptr_t)proc_kstacks[pid - 1] + KERNEL_STACK_SIZE;
    struct exception_frame *f = (struct exception_frame *)(p->kstack_top - FRAME_SIZE);
    memset(f, 0, sizeof(*f));
    f->pc = p->entry;
    f->pstate = 0;
    f->sp = USER_STACK_TOP;
    uint64_t *sw = (uint64_t *)((uintptr_t)f - SWITCH_FRAME_SIZE);
    memset(sw, 0, SWITCH_FRAME_SIZE);
    sw[1] = (uintptr_t)proc_start_user;                 /* x30; x29 = 0, x19..x28 = 0 */
    p->ksp = (uintptr_t)sw;

    nproc_created++;
    kprintf("qmpprof-guest: process pid=%d name=%s cr3=0x%lx entry=0x%lx\n", p->pid, p->name,
            (uint64_t)p->cr3, (uint64_t)p->entry);
    sched_make_runnable(p);
    return p;
}

/* kernel_main for workload=user (after the boot messages, gic_init and
 * cpu_init(0)). */
CHAIN_FN void user_workload_main(void)
{
    uint64_t frq;
    __asm__ volatile("mrs %0, cntfrq_el0" : "=r"(frq));
    tsc_per_ms = frq / 1000;
    mm_init(boot_mem_start, boot_mem_start + boot_mem_size);
    kernel_cr3 = VIRT_TO_PHYS(empty_l0);
    ncpus = psci_cpu_count();
    kprintf("qmpprof-guest: generic timer %lu Hz, %lu counts per tick\n", frq, frq / TIMER_HZ);
    kprintf("qmpprof-guest: workload user, %u CPUs, process_table at %p, cpu_current at %p\n",
            ncpus, (void *)process_table, (void *)cpu_current);

    syscall_init();
    proc_create(1, "crunch", user_crunch_elf, (uint64_t)(user_crunch_elf_end - user_crunch_elf));
    proc_create(2, "crunch", user_crunch_elf, (uint64_t)(user_crunch_elf_end - user_crunch_elf));
    proc_create(3, "pulse", user_pulse_elf, (uint64_t)(user_pulse_elf_end - user_pulse_elf));

    cpus[0].idle_start = rdtsc();
    cpus[0].online = 1;
    sched_running = 1;
    smp_start_aps();
    timer_start();

    /* This is CPU 0's idle context: processes run whenever they are runnable. */
    cpu_sti();
    while (procs_started < nproc_created)
        __asm__ volatile("wfi" ::: "memory");
    cpu_cli();
    spin_lock(&console_lock);
    kprintf("qmpprof-guest: %u processes running on %u CPUs\n", nproc_created, ncpus);
    serial_puts("qmpprof-guest: ready\n");
    spin_unlock(&console_lock);
    cpu_idle();
}
