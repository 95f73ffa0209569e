/* qmpprof example guest, AArch64 build: processes, scheduler, CPUs.
 *
 * Replaces src/proc.h for ARCH=aarch64 (same guard, force-included by the
 * Makefile before every kernel source). struct process and
 * process_table[] / cpu_current[] have the same members as on x86 (DWARF
 * names pid, name, cr3 ...); `cr3` holds the process's TTBR0_EL1 value. */
#ifndef QMPPROF_GUEST_PROC_H
#define QMPPROF_GUEST_PROC_H

#include "kernel.h"
#include "uapi.h"

/* ---- spinlocks (every user of them runs with IRQs masked) ---- */
typedef struct {
    volatile uint32_t locked;
} spinlock_t;

static inline __attribute__((always_inline)) void spin_lock(spinlock_t *l)
{
    while (__atomic_exchange_n(&l->locked, 1, __ATOMIC_ACQUIRE))
        while (l->locked)
            __asm__ volatile("yield" ::: "memory");
}

static inline __attribute__((always_inline)) void spin_unlock(spinlock_t *l)
{
    __atomic_store_n(&l->locked, 0, __ATOMIC_RELEASE);
}

/* ---- processes ---- */
enum proc_state {
    PROC_UNUSED = 0,
    PROC_RUNNABLE = 1,
    PROC_RUNNING = 2,
    PROC_SLEEPING = 3,
    PROC_EXITED = 4,
};

struct process {
    int pid;                        /* 1, 2, 3, ...; 0 = unused slot */
    char name[16];                  /* NUL-terminated, e.g. "crunch" */
    uintptr_t cr3;                  /* its TTBR0_EL1: physical address of its L0 table
                                       | ASID (= pid) << 48 */
    enum proc_state state;
    int cpu;                        /* CPU it runs / last ran on, -1 = never ran */
    uintptr_t entry;                /* ELF entry point (_start) */
    uintptr_t user_stack_top;
    uintptr_t kstack_top;           /* SP_EL1 at an exception from EL0 */
    uintptr_t ksp;                  /* saved kernel sp while switched out */
    uint64_t wake_tick;             /* PROC_SLEEPING: wake when timer_ticks >= this */
    uint64_t run_tsc;               /* counter (CNTVCT) ticks run so far */
    uint64_t run_start;             /* CNTVCT at the last switch-in */
    uint64_t runs;                  /* number of switch-ins */
    uint64_t syscalls;              /* number of system calls */
    volatile uint32_t on_cpu;       /* 1 while some CPU is still on its kernel stack */
    struct user_info *info;         /* kernel address of its user_info page */
    struct process *next;           /* run queue link */
};

extern struct process process_table[NPROC];
/* The process running on each CPU (index = CPU number = MPIDR_EL1.Aff0 = QEMU
 * cpu-index), NULL when the CPU runs no process (idle, or the kernel workload). */
extern struct process *cpu_current[NCPU];
extern volatile uint32_t procs_started;
extern uint32_t nproc_created;

/* ---- CPUs ---- */
struct cpu {
    uint32_t id;                    /* CPU number = index in cpus[]; TPIDR_EL1 = &cpus[id] */
    volatile uint32_t online;
    uintptr_t idle_ksp;             /* saved sp of the idle context (kernel_stacks[id]) */
    volatile uint64_t ticks;        /* timer interrupts on this CPU */
    volatile uint64_t tick_tsc;     /* CNTVCT at the last one */
    uint64_t idle_tsc;              /* counter ticks in the idle context */
    uint64_t idle_start;            /* CNTVCT when the idle context was last switched in */
    uint64_t mpidr;                 /* MPIDR_EL1 */
};
/* No TSS: an exception from EL0 uses SP_EL1, which is the top of the
 * process's kernel stack whenever it runs in EL0. */
#define tss_set_sp0(c, sp) ((void)(c), (void)(sp))

extern struct cpu cpus[MAX_CPUS];
extern uint32_t ncpus;
extern volatile uint32_t sched_running;
extern uint64_t tsc_per_ms;                 /* CNTVCT ticks per millisecond */
extern uintptr_t kernel_cr3;                /* TTBR0_EL1 with no process: empty_l0, ASID 0 */

/* ---- mm.c ---- */
#define PAGE_SIZE   4096ULL
/* stage 1 descriptor bits (4 KiB granule) */
#define PTE_VALID   (1ULL << 0)
#define PTE_TABLE   (1ULL << 1)             /* table (levels 0-2) / page (level 3) */
#define PTE_ATTR_DEVICE (0ULL << 2)         /* MAIR_EL1 attr 0: Device-nGnRE */
#define PTE_ATTR_NORMAL (1ULL << 2)         /* MAIR_EL1 attr 1: Normal WB */
#define PTE_AP_EL0  (1ULL << 6)             /* AP[1]: EL0 access */
#define PTE_AP_RO   (1ULL << 7)             /* AP[2]: read-only */
#define PTE_SH_INNER (3ULL << 8)
#define PTE_AF      (1ULL << 10)
#define PTE_NG      (1ULL << 11)            /* not global: tagged with the ASID */
#define PTE_PXN     (1ULL << 53)
#define PTE_UXN     (1ULL << 54)
#define PTE_ADDR    0x0000fffffffff000ULL
/* user page kinds for map_page() */
#define PTE_USER_RX (PTE_AP_EL0 | PTE_AP_RO | PTE_PXN)
#define PTE_USER_RO (PTE_AP_EL0 | PTE_AP_RO | PTE_PXN | PTE_UXN)
#define PTE_USER_RW (PTE_AP_EL0 | PTE_PXN | PTE_UXN)
#define TTBR_ASID_SHIFT 48
#define PHYS_TO_VIRT(p) ((void *)((uintptr_t)(p) + KERNEL_VMA))
#define VIRT_TO_PHYS(v) ((uintptr_t)(v) - KERNEL_VMA)

void mm_init(uint64_t mem_start, uint64_t mem_end);
uint64_t alloc_page(void);                  /* zeroed 4 KiB page, physical address */
uint64_t new_address_space(void);           /* empty L0 table for TTBR0_EL1 */
void map_page(uint64_t l0, uint64_t va, uint64_t pa, uint64_t flags);
uint64_t user_page_phys(uint64_t l0, uint64_t va); /* 0 if not mapped */

/* ---- smp.c ---- */
/* sched.c / timer.c use the x86 names: the LAPIC EOI is a no-op here (the
 * IRQ stub sends the GIC EOI before it calls the handler), the IPI is an SGI. */
#define lapic_eoi() ((void)0)
#define lapic_send_ipi(cpu, vec) gic_send_sgi((cpu), (vec))
#define RESCHED_VECTOR RESCHED_SGI
void cpu_init(uint32_t id);                 /* TPIDR_EL1, GIC CPU interface, counter access */
void smp_start_aps(void);
uint32_t psci_cpu_count(void);
void ap_main(uint64_t id);

/* ---- sched.c ---- */
void cpu_idle(void) __attribute__((noreturn));
void schedule(void);
void sched_clock_tick(void);
void sched_tick(void);
void resched_interrupt_handler(void);
void sched_make_runnable(struct process *p);
uint64_t sys_sleep(uint64_t ticks);
uint64_t sys_yield(void);
void sys_exit(uint64_t code) __attribute__((noreturn));
void switch_context(uintptr_t *save_ksp, uintptr_t new_ksp, uintptr_t new_cr3,
                    volatile uint32_t *prev_on_cpu);
void proc_start_user(void);                 /* entry.S: first return to EL0 */

/* ---- proc.c ---- */
struct process *proc_create(int pid, const char *name, const uint8_t *elf, uint64_t size);
void user_workload_main(void) __attribute__((noreturn));

/* ---- syscall.c ---- */
void syscall_init(void);
uint64_t syscall_dispatch(uint64_t nr, uint64_t a1, uint64_t a2);
void syscall_entry(void);                   /* entry.S: synchronous exception from EL0 */
void resched_irq_entry(void);               /* entry.S: RESCHED_SGI */

extern spinlock_t console_lock;

/* Number of the calling CPU: TPIDR_EL1 = &cpus[id] (cpu_init), one system
 * register read and one load. volatile: a process can continue on another
 * CPU after schedule(). */
static inline __attribute__((always_inline)) uint32_t cpu_id(void)
{
    const struct cpu *c;
    __asm__ volatile("mrs %0, tpidr_el1" : "=r"(c));
    return c->id;
}

static inline __attribute__((always_inline)) struct cpu *this_cpu(void)
{
    return &cpus[cpu_id()];
}

#endif
