/* qmpprof example guest: processes of the user workload (boot option
 * workload=user, x86-64 also workload=compat) and the boot sequence that
 * starts them.
 *
 * The user programs (user/NAME.c, static non-PIE ELF64 linked at 0x400000;
 * i386: ELF32 linked at 0x08048000; x86-64 workload=compat: also crunch as
 * ELF32, crunch32.elf, run in compatibility mode) are
 * embedded in the kernel image by user_blobs.S. proc_create() gives each
 * process its own address space (PML4 = cr3, kernel half shared), copies the
 * ELF's PT_LOAD segments into fresh pages mapped at p_vaddr, maps a user
 * stack below USER_STACK_TOP and a read-only struct user_info page at
 * USER_INFO_VA, and builds an initial kernel stack that "returns" to ring 3
 * at the ELF entry (_start). */
#include "proc.h"

extern const uint8_t user_crunch_elf[], user_crunch_elf_end[];
extern const uint8_t user_pulse_elf[], user_pulse_elf_end[];
#ifndef __i386__
extern const uint8_t user_crunch32_elf[], user_crunch32_elf_end[];
#endif

/* Kernel stacks of the processes (slot = pid - 1), aligned to their size. */
uint8_t proc_kstacks[NPROC][KERNEL_STACK_SIZE] __attribute__((aligned(KERNEL_STACK_SIZE)));
uint32_t nproc_created;

/* ELF headers of both classes: the i386 kernel loads ELF32 programs, the
 * x86-64 kernel ELF64 ones and (workload=compat) ELF32 ones as 32-bit
 * processes in compatibility mode. */
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

struct elf32_ehdr {
    uint8_t e_ident[16];
    uint16_t e_type, e_machine;
    uint32_t e_version;
    uint32_t e_entry, e_phoff, e_shoff;
    uint32_t e_flags;
    uint16_t e_ehsize, e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx;
};

struct elf32_phdr {
    uint32_t p_type, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_flags, p_align;
};

#define ELFCLASS32  1
#define ELFCLASS64  2
#define EM_386      3
#define EM_X86_64   62
#define ET_EXEC     2
#define PT_LOAD     1
#define PF_W        2
#define USER64_VA_END 0x7ff000000000ULL

#ifndef __i386__
#define ELF_WHAT    "not an x86-64 or i386 ELF executable"
#else
#define ELF_WHAT    "not an i386 ELF executable"
#endif

static __attribute__((noreturn)) void user_panic(const char *what)
{
    kprintf("qmpprof-guest: cannot create process: %s\n", what);
    for (;;)
        __asm__ volatile("cli; hlt");
}

/* A program header of either class. */
struct elf_seg {
    uint32_t type, flags;
    uint64_t offset, vaddr, filesz, memsz;
};

/* Copy the PT_LOAD segments into new pages of address space `pml4`;
 * returns the entry point. *is32: an ELF32 (i386) program, which the x86-64
 * kernel runs in compatibility mode. */
static uint64_t elf_load(uint64_t pml4, const uint8_t *elf, uint64_t size, int *is32)
{
    const struct elf64_ehdr *eh64 = (const struct elf64_ehdr *)elf;
    const struct elf32_ehdr *eh32 = (const struct elf32_ehdr *)elf;
    if (size < sizeof(*eh32) || elf[0] != 0x7f || elf[1] != 'E' || elf[2] != 'L' ||
        elf[3] != 'F')
        user_panic(ELF_WHAT);
    uint64_t entry, phoff, phnum, phentsize, va_end;
#ifndef __i386__
    if (elf[4] == ELFCLASS64 && size >= sizeof(*eh64) && eh64->e_machine == EM_X86_64 &&
        eh64->e_type == ET_EXEC) {
        *is32 = 0;
        entry = eh64->e_entry;
        phoff = eh64->e_phoff;
        phnum = eh64->e_phnum;
        phentsize = eh64->e_phentsize;
        va_end = USER64_VA_END;
    } else
#endif
    if (elf[4] == ELFCLASS32 && eh32->e_machine == EM_386 && eh32->e_type == ET_EXEC) {
        *is32 = 1;
        entry = eh32->e_entry;
        phoff = eh32->e_phoff;
        phnum = eh32->e_phnum;
        phentsize = eh32->e_phentsize;
        va_end = USER32_VA_END;
    } else {
        user_panic(ELF_WHAT);
    }
    (void)eh64;
    if (phoff + phnum * phentsize > size)
        user_panic("program headers out of range");
    for (unsigned i = 0; i < phnum; i++) {
        const uint8_t *raw = elf + phoff + (uint64_t)i * phentsize;
        struct elf_seg ph;
        if (*is32) {
            const struct elf32_phdr *p32 = (const struct elf32_phdr *)raw;
            ph = (struct elf_seg){ p32->p_type, p32->p_flags, p32->p_offset, p32->p_vaddr,
                                   p32->p_filesz, p32->p_memsz };
        } else {
            const struct elf64_phdr *p64 = (const struct elf64_phdr *)raw;
            ph = (struct elf_seg){ p64->p_type, p64->p_flags, p64->p_offset, p64->p_vaddr,
                                   p64->p_filesz, p64->p_memsz };
        }
        if (ph.type != PT_LOAD || ph.memsz == 0)
            continue;
        if (ph.offset + ph.filesz > size || ph.filesz > ph.memsz ||
            ph.vaddr < 0x1000 || ph.vaddr + ph.memsz > va_end)
            user_panic("bad PT_LOAD segment");
        uint64_t flags = PTE_P | PTE_U | ((ph.flags & PF_W) ? PTE_W : 0);
        uint64_t end = ph.vaddr + ph.memsz;
        for (uint64_t va = ph.vaddr & ~(PAGE_SIZE - 1); va < end; va += PAGE_SIZE) {
            uint64_t pa = user_page_phys(pml4, va);
            if (!pa)
                map_page(pml4, va, alloc_page(), flags);
            else if (flags & PTE_W)     /* page shared with the previous segment */
                map_page(pml4, va, pa, flags);
        }
        for (uint64_t off = 0; off < ph.filesz;) {
            uint64_t va = ph.vaddr + off;
            uint64_t in_page = va & (PAGE_SIZE - 1);
            uint64_t n = PAGE_SIZE - in_page;
            if (n > ph.filesz - off)
                n = ph.filesz - off;
            uint8_t *dst = (uint8_t *)PHYS_TO_VIRT(user_page_phys(pml4, va)) + in_page;
            memcpy(dst, elf + ph.offset + off, n);
            off += n;
        }
    }
    return entry;
}

struct process *proc_create(int pid, const char *name, const uint8_t *elf, uint64_t size)
{
    struct process *p = &process_table[pid - 1];
    p->pid = pid;
    for (int i = 0; i < (int)sizeof(p->name) - 1 && name[i]; i++)
        p->name[i] = name[i];
    p->cpu = -1;
    p->cr3 = new_address_space();
    int is32;
    p->entry = elf_load(p->cr3, elf, size, &is32);
    /* Native processes: USER_CS and the layout of src/uapi.h. An ELF32
     * program under the x86-64 kernel (workload=compat): a 32-bit process in
     * compatibility mode, code segment USER32_CS (L=0, D=1), stack and
     * SS/DS/ES USER_DS (flat 32-bit data), the i386 build's layout
     * (USER32_*). Nothing else in the kernel depends on it: the system call
     * stub tells its ABI from the CS the CPU pushed. */
    uintptr_t stack_top = USER_STACK_TOP, info_va = USER_INFO_VA, user_cs = USER_CS;
#ifndef __i386__
    if (is32) {
        stack_top = USER32_STACK_TOP;
        info_va = USER32_INFO_VA;
        user_cs = USER32_CS;
    }
#else
    (void)is32;
#endif

    for (uint64_t i = 0; i < USER_STACK_PAGES; i++)
        map_page(p->cr3, stack_top - (i + 1) * PAGE_SIZE, alloc_page(),
                 PTE_P | PTE_W | PTE_U);
    p->user_stack_top = stack_top;

    uint64_t info = alloc_page();
    map_page(p->cr3, info_va, info, PTE_P | PTE_U);         /* read-only for ring 3 */
    p->info = PHYS_TO_VIRT(info);
    p->info->pid = pid;
    p->info->ncpu = (int32_t)ncpus;
    p->info->tsc_per_ms = tsc_per_ms;
    p->info->hz = TIMER_HZ;
    p->info->ticks = timer_ticks;

    /* Initial kernel stack: switch_context pops SWITCH_SAVED_REGS registers
     * and returns to proc_start_user, which irets to ring 3 at _start (the
     * iret frame to ring 3 has the same five words in both modes, 8 bytes
     * each on x86-64, 4 on i386). */
    p->kstack_top = (uintptr_t)proc_kstacks[pid - 1] + KERNEL_STACK_SIZE;
    uintptr_t *sp = (uintptr_t *)p->kstack_top;
    *--sp = USER_DS;                    /* SS */
    *--sp = stack_top;                  /* RSP */
    *--sp = 0x202;                      /* RFLAGS: IF */
    *--sp = user_cs;                    /* CS */
    *--sp = p->entry;                   /* RIP */
    *--sp = (uintptr_t)proc_start_user; /* return address of switch_context */
    for (int i = 0; i < SWITCH_SAVED_REGS; i++)
        *--sp = 0;                      /* rbp rbx r12 r13 r14 r15 (i386: ebp ebx esi edi) */
    p->ksp = (uintptr_t)sp;

    nproc_created++;
    kprintf("qmpprof-guest: process pid=%d name=%s cr3=0x%lx entry=0x%lx\n", p->pid, p->name,
            (uint64_t)p->cr3, (uint64_t)p->entry);
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
#ifndef __i386__
    kernel_cr3 = VIRT_TO_PHYS(kernel_pml4);
#else
    kernel_cr3 = boot_paging_pae ? VIRT_TO_PHYS(kernel_pdpt) : VIRT_TO_PHYS(kernel_pgdir);
#endif
    cpu_init(0);
    lapic_calibrate();
    ncpus = fw_cfg_cpu_count();
    if (ncpus > MAX_CPUS)
        ncpus = MAX_CPUS;
    kprintf("qmpprof-guest: workload %s, %u CPUs, process_table at %p, cpu_current at %p\n",
            boot_workload == WORKLOAD_COMPAT ? "compat" : "user", ncpus, (void *)process_table,
            (void *)cpu_current);

    syscall_init();
    proc_create(1, "crunch", user_crunch_elf, (uint64_t)(user_crunch_elf_end - user_crunch_elf));
#ifndef __i386__
    if (boot_workload == WORKLOAD_COMPAT)   /* pid 2: crunch as ELF32, compatibility mode */
        proc_create(2, "crunch32", user_crunch32_elf,
                    (uint64_t)(user_crunch32_elf_end - user_crunch32_elf));
    else
#endif
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
