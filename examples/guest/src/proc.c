/* qmpprof example guest: processes of the user workload (boot option
 * workload=user) and the boot sequence that starts them.
 *
 * The user programs (user/NAME.c, static non-PIE ELF64 linked at 0x400000) are
 * embedded in the kernel image by user_blobs.S. proc_create() gives each
 * process its own address space (PML4 = cr3, kernel half shared), copies the
 * ELF's PT_LOAD segments into fresh pages mapped at p_vaddr, maps a user
 * stack below USER_STACK_TOP and a read-only struct user_info page at
 * USER_INFO_VA, and builds an initial kernel stack that "returns" to ring 3
 * at the ELF entry (_start). */
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

#define PT_LOAD 1
#define PF_W    2
#define USER_VA_END 0x7ff000000000ULL

static void user_panic(const char *what)
{
    kprintf("qmpprof-guest: cannot create process: %s\n", what);
    for (;;)
        __asm__ volatile("cli; hlt");
}

/* Copy the PT_LOAD segments into new pages of address space `pml4`;
 * returns the entry point. */
static uint64_t elf_load(uint64_t pml4, const uint8_t *elf, uint64_t size)
{
    const struct elf64_ehdr *eh = (const struct elf64_ehdr *)elf;
    if (size < sizeof(*eh) || eh->e_ident[0] != 0x7f || eh->e_ident[1] != 'E' ||
        eh->e_ident[2] != 'L' || eh->e_ident[3] != 'F' || eh->e_ident[4] != 2 ||
        eh->e_machine != 62 || eh->e_type != 2)
        user_panic("not an x86-64 ELF executable");
    if (eh->e_phoff + (uint64_t)eh->e_phnum * eh->e_phentsize > size)
        user_panic("program headers out of range");
    for (unsigned i = 0; i < eh->e_phnum; i++) {
        const struct elf64_phdr *ph =
            (const struct elf64_phdr *)(elf + eh->e_phoff + (uint64_t)i * eh->e_phentsize);
        if (ph->p_type != PT_LOAD || ph->p_memsz == 0)
            continue;
        if (ph->p_offset + ph->p_filesz > size || ph->p_filesz > ph->p_memsz ||
            ph->p_vaddr < 0x1000 || ph->p_vaddr + ph->p_memsz > USER_VA_END)
            user_panic("bad PT_LOAD segment");
        uint64_t flags = PTE_P | PTE_U | ((ph->p_flags & PF_W) ? PTE_W : 0);
        uint64_t end = ph->p_vaddr + ph->p_memsz;
        for (uint64_t va = ph->p_vaddr & ~(PAGE_SIZE - 1); va < end; va += PAGE_SIZE) {
            uint64_t pa = user_page_phys(pml4, va);
            if (!pa)
                map_page(pml4, va, alloc_page(), flags);
            else if (flags & PTE_W)     /* page shared with the previous segment */
                map_page(pml4, va, pa, flags);
        }
        for (uint64_t off = 0; off < ph->p_filesz;) {
            uint64_t va = ph->p_vaddr + off;
            uint64_t in_page = va & (PAGE_SIZE - 1);
            uint64_t n = PAGE_SIZE - in_page;
            if (n > ph->p_filesz - off)
                n = ph->p_filesz - off;
            uint8_t *dst = (uint8_t *)PHYS_TO_VIRT(user_page_phys(pml4, va)) + in_page;
            memcpy(dst, elf + ph->p_offset + off, n);
            off += n;
        }
    }
    return eh->e_entry;
}

struct process *proc_create(int pid, const char *name, const uint8_t *elf, uint64_t size)
{
    struct process *p = &process_table[pid - 1];
    p->pid = pid;
    for (int i = 0; i < (int)sizeof(p->name) - 1 && name[i]; i++)
        p->name[i] = name[i];
    p->cpu = -1;
    p->cr3 = new_address_space();
    p->entry = elf_load(p->cr3, elf, size);

    for (uint64_t i = 0; i < USER_STACK_PAGES; i++)
        map_page(p->cr3, USER_STACK_TOP - (i + 1) * PAGE_SIZE, alloc_page(),
                 PTE_P | PTE_W | PTE_U);
    p->user_stack_top = USER_STACK_TOP;

    uint64_t info = alloc_page();
    map_page(p->cr3, USER_INFO_VA, info, PTE_P | PTE_U);    /* read-only for ring 3 */
    p->info = PHYS_TO_VIRT(info);
    p->info->pid = pid;
    p->info->ncpu = (int32_t)ncpus;
    p->info->tsc_per_ms = tsc_per_ms;
    p->info->hz = TIMER_HZ;
    p->info->ticks = timer_ticks;

    /* Initial kernel stack: switch_context pops 6 registers and returns to
     * proc_start_user, which irets to ring 3 at _start. */
    p->kstack_top = (uint64_t)proc_kstacks[pid - 1] + KERNEL_STACK_SIZE;
    uint64_t *sp = (uint64_t *)p->kstack_top;
    *--sp = USER_DS;                    /* SS */
    *--sp = USER_STACK_TOP;             /* RSP */
    *--sp = 0x202;                      /* RFLAGS: IF */
    *--sp = USER_CS;                    /* CS */
    *--sp = p->entry;                   /* RIP */
    *--sp = (uint64_t)proc_start_user;  /* return address of switch_context */
    for (int i = 0; i < 6; i++)
        *--sp = 0;                      /* rbp rbx r12 r13 r14 r15 */
    p->ksp = (uint64_t)sp;

    nproc_created++;
    kprintf("qmpprof-guest: process pid=%d name=%s cr3=0x%lx entry=0x%lx\n", p->pid, p->name,
            p->cr3, p->entry);
    sched_make_runnable(p);
    return p;
}

/* kernel_main for workload=user (after serial and the boot messages). */
CHAIN_FN void user_workload_main(void)
{
    const struct {
        uint32_t flags, mem_lower, mem_upper;
    } *mbi = (const void *)(KERNEL_VMA + boot_multiboot_info);
    uint64_t mem_end = 16ULL << 20;
    if (boot_multiboot_magic == 0x2badb002 && (mbi->flags & 1))
        mem_end = (1ULL << 20) + (uint64_t)mbi->mem_upper * 1024;

    /* Same start as the kernel workload: PIT ticks through the 8259. */
    idt_init();
    pic_init();
    pit_init(TIMER_HZ);
    cpu_sti();
    uint64_t start = timer_ticks;
    while (timer_ticks < start + 2)
        __asm__ volatile("hlt" ::: "memory");

    /* From now on the LAPIC timers tick; the 8259 is masked for good (the
     * PIT keeps counting: lapic_calibrate polls it). */
    cpu_cli();
    outb(0x21, 0xff);
    outb(0xa1, 0xff);
    mm_init(mem_end);
    map_lapic();
    kernel_cr3 = VIRT_TO_PHYS(kernel_pml4);
    cpu_init(0);
    lapic_calibrate();
    ncpus = fw_cfg_cpu_count();
    if (ncpus > MAX_CPUS)
        ncpus = MAX_CPUS;
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
    lapic_timer_start();

    /* This is CPU 0's idle context: processes run whenever they are runnable. */
    cpu_sti();
    while (procs_started < nproc_created)
        __asm__ volatile("hlt" ::: "memory");
    cpu_cli();
    spin_lock(&console_lock);
    kprintf("qmpprof-guest: %u processes running on %u CPUs\n", nproc_created, ncpus);
    serial_puts("qmpprof-guest: ready\n");
    spin_unlock(&console_lock);
    cpu_idle();
}
