/* qmpprof example guest: processes, scheduler, CPUs (the "user" workload).
 *
 * process_table[] and cpu_current[] are read from outside (GDB, qmpprof) by
 * name through DWARF: keep `pid`, `name` and `cr3` real members of
 * struct process. */
#ifndef QMPPROF_GUEST_PROC_H
#define QMPPROF_GUEST_PROC_H

#include "kernel.h"
#include "uapi.h"

/* ---- spinlocks (every user of them runs with interrupts disabled) ---- */
typedef struct {
    volatile uint32_t locked;
} spinlock_t;

static inline __attribute__((always_inline)) void spin_lock(spinlock_t *l)
{
    while (__atomic_exchange_n(&l->locked, 1, __ATOMIC_ACQUIRE))
        while (l->locked)
            __asm__ volatile("pause" ::: "memory");
}

static inline __attribute__((always_inline)) void spin_unlock(spinlock_t *l)
{
    __atomic_store_n(&l->locked, 0, __ATOMIC_RELEASE);
}

/* ---- processes ---- */
enum proc_state {
    PROC_UNUSED = 0,
    PROC_RUNNABLE = 1,      /* in the run queue */
    PROC_RUNNING = 2,       /* cpu_current[cpu] of some CPU */
    PROC_SLEEPING = 3,      /* in sys_sleep until timer_ticks >= wake_tick */
    PROC_EXITED = 4,
};

struct process {
    int pid;                        /* 1, 2, 3, ...; 0 = unused slot */
    char name[16];                  /* NUL-terminated, e.g. "crunch" */
    uintptr_t cr3;                  /* physical address of its PML4 (i386: page directory / PDPT) */
    enum proc_state state;
    int cpu;                        /* CPU it runs / last ran on, -1 = never ran */
    uintptr_t entry;                /* ELF entry point (_start) */
    uintptr_t user_stack_top;
    uintptr_t kstack_top;           /* TSS.RSP0 (i386: ESP0) while it runs */
    uintptr_t ksp;                  /* saved kernel rsp while switched out */
    uint64_t wake_tick;             /* PROC_SLEEPING: wake when timer_ticks >= this */
    uint64_t run_tsc;               /* TSC cycles run (switched in) so far */
    uint64_t run_start;             /* TSC at the last switch-in */
    uint64_t runs;                  /* number of switch-ins */
    uint64_t syscalls;              /* number of system calls */
    volatile uint32_t on_cpu;       /* 1 while some CPU is still on its kernel stack */
    struct user_info *info;         /* kernel address of its user_info page */
    struct process *next;           /* run queue link */
};

extern struct process process_table[NPROC];
/* The process running on each CPU (index = LAPIC ID = QEMU cpu-index),
 * NULL when the CPU runs no process (idle, or the kernel workload). */
extern struct process *cpu_current[NCPU];
extern volatile uint32_t procs_started;     /* processes switched in at least once */
extern uint32_t nproc_created;

/* ---- CPUs ---- */
#ifndef __i386__
struct tss64 {
    uint32_t reserved0;
    uint64_t rsp0, rsp1, rsp2;
    uint64_t reserved1;
    uint64_t ist[7];
    uint64_t reserved2;
    uint16_t reserved3;
    uint16_t iomap_base;
} __attribute__((packed));
#define tss_set_sp0(c, sp) ((c)->tss.rsp0 = (sp))
#else
struct tss32 {
    uint16_t link, reserved0;
    uint32_t esp0;                  /* kernel stack for interrupts from ring 3 */
    uint16_t ss0, reserved1;
    uint32_t esp1;
    uint16_t ss1, reserved2;
    uint32_t esp2;
    uint16_t ss2, reserved3;
    uint32_t cr3, eip, eflags, eax, ecx, edx, ebx, esp, ebp, esi, edi;
    uint16_t es, r_es, cs, r_cs, ss, r_ss, ds, r_ds, fs, r_fs, gs, r_gs, ldt, r_ldt;
    uint16_t trap;
    uint16_t iomap_base;
} __attribute__((packed));
#define tss_set_sp0(c, sp) ((c)->tss.esp0 = (sp))
#endif

struct cpu {
    uint32_t id;                    /* LAPIC ID = index in cpus[]; first member: %gs:0 */
    volatile uint32_t online;
    uintptr_t idle_ksp;             /* saved rsp of the idle context (kernel_stacks[id]) */
    volatile uint64_t ticks;        /* LAPIC timer interrupts on this CPU */
    volatile uint64_t tick_tsc;     /* TSC at the last one */
    uint64_t idle_tsc;              /* TSC cycles in the idle context (before idle_start) */
    uint64_t idle_start;            /* TSC when the idle context was last switched in */
    uint64_t gdt[8] __attribute__((aligned(16)));
#ifndef __i386__
    struct tss64 tss __attribute__((aligned(16)));
#else
    struct tss32 tss __attribute__((aligned(16)));
#endif
};

extern struct cpu cpus[MAX_CPUS];
extern uint32_t ncpus;                      /* CPUs in use (user workload) */
extern volatile uint32_t sched_running;     /* LAPIC timer + scheduler active */
extern uint64_t tsc_per_ms;
extern uintptr_t kernel_cr3;                /* physical address of kernel_pml4 (i386: of
                                               kernel_pgdir or kernel_pdpt) */

/* ---- mm.c ---- */
#define PAGE_SIZE   4096ULL
#define PTE_P       0x001ULL
#define PTE_W       0x002ULL
#define PTE_U       0x004ULL
#define PTE_PWT     0x008ULL
#define PTE_PCD     0x010ULL
#define PTE_PS      0x080ULL
#define PTE_ADDR    0x000ffffffffff000ULL
#define PHYS_TO_VIRT(p) ((void *)((uintptr_t)(p) + KERNEL_VMA))
#define VIRT_TO_PHYS(v) ((uintptr_t)(v) - KERNEL_VMA)

void mm_init(uint64_t mem_end);
uint64_t alloc_page(void);                  /* zeroed 4 KiB page, physical address */
uint64_t new_address_space(void);           /* PML4 sharing the kernel half */
void map_page(uint64_t pml4, uint64_t va, uint64_t pa, uint64_t flags);
uint64_t user_page_phys(uint64_t pml4, uint64_t va); /* 0 if not mapped */
void map_lapic(void);
uint64_t ap_boot_pml4(void);                /* kernel half + identity map of 0..1 GiB
                                               (i386: a page directory / PDPT, see i386/mm.c) */

/* ---- smp.c ---- */
uint32_t lapic_id(void);
void lapic_eoi(void);
void lapic_send_ipi(uint32_t apic_id, uint32_t vector);
void cpu_init(uint32_t id);                 /* GDT, TSS, IDT, LAPIC (not its timer) */
void lapic_calibrate(void);
void lapic_timer_start(void);
void smp_start_aps(void);
uint32_t fw_cfg_cpu_count(void);
void udelay(uint64_t us);
void ap_main(void);
void ap_entry(void);

/* ---- sched.c ---- */
void cpu_idle(void) __attribute__((noreturn));
void schedule(void);
void sched_clock_tick(void);                /* start of a LAPIC timer tick */
void sched_tick(void);                      /* end of a LAPIC timer tick: wakeups, RR */
void resched_interrupt_handler(void);
void sched_make_runnable(struct process *p);
uint64_t sys_sleep(uint64_t ticks);
uint64_t sys_yield(void);
void sys_exit(uint64_t code) __attribute__((noreturn));
void switch_context(uintptr_t *save_ksp, uintptr_t new_ksp, uintptr_t new_cr3,
                    volatile uint32_t *prev_on_cpu);
void proc_start_user(void);                 /* isr.S: first return to ring 3 */

/* ---- proc.c ---- */
struct process *proc_create(int pid, const char *name, const uint8_t *elf, uint64_t size);
void user_workload_main(void) __attribute__((noreturn));

/* ---- syscall.c ---- */
void syscall_init(void);
uint64_t syscall_dispatch(uint64_t nr, uint64_t a1, uint64_t a2);
void syscall_entry(void);                   /* isr.S, vector 0x80, DPL 3 */
void resched_irq_entry(void);               /* isr.S, RESCHED_VECTOR */

extern spinlock_t console_lock;

/* Number of the calling CPU. Each CPU's GS base points to its struct cpu
 * (cpu_init; the kernel never loads %gs and the user programs do not touch
 * it), so this is one memory load, not an LAPIC MMIO read (which would take
 * QEMU's global lock). volatile: a process can continue on another CPU after
 * schedule(). (i386: %gs = PERCPU_SEL, a DPL-3 data segment of the CPU's own
 * GDT with base &cpus[id], loaded once by cpu_init; DPL 3 so that an iret to
 * ring 3 keeps it, its page is still supervisor-only.) */
static inline __attribute__((always_inline)) uint32_t cpu_id(void)
{
    uint32_t id;
    __asm__ volatile("movl %%gs:0, %0" : "=r"(id));
    return id;
}

static inline __attribute__((always_inline)) struct cpu *this_cpu(void)
{
    return &cpus[cpu_id()];
}

#endif
