/* qmpprof example guest, AArch64 build: GICv2, generic timer, PSCI, CPUs.
 *
 * GIC (QEMU -M virt default, GICv2): distributor at 0x08000000, CPU
 * interface at 0x08010000 (both mapped at KERNEL_VMA + phys). Used
 * interrupts: the EL1 virtual timer PPI (INTID 27, TIMER_INTID) on every
 * CPU and SGI 1 (RESCHED_SGI) for the reschedule IPI. The IRQ stub
 * (entry.S timer_irq_entry) acknowledges (GICC_IAR), re-arms the timer
 * (CNTV_TVAL_EL0 = timer_interval) and sends the EOI before it calls
 * timer_interrupt_handler.
 *
 * CPUs: CPU n has MPIDR_EL1 Aff0 = n (plain -smp N, N <= 8). Their number is
 * found with PSCI AFFINITY_INFO (QEMU answers INVALID_PARAMETERS for a CPU
 * that does not exist); the others are started one after the other with PSCI
 * CPU_ON (HVC: QEMU's built-in PSCI when there is no EL2/EL3 firmware) at
 * secondary_start (physical), context id = CPU number. */
#include "proc.h"

#define GICD_CTLR       0x000
#define GICD_ISENABLER  0x100
#define GICD_IPRIORITYR 0x400
#define GICD_SGIR       0xf00
#define GICC_CTLR       0x000
#define GICC_PMR        0x004

struct cpu cpus[MAX_CPUS];
uint32_t ncpus = 1;
uint64_t tsc_per_ms;                    /* 0 in the kernel workload (no time cap) */
uint64_t timer_interval;                /* counter ticks per timer tick */

static inline uint64_t psci_call(uint64_t fn, uint64_t a1, uint64_t a2, uint64_t a3)
{
    register uint64_t x0 __asm__("x0") = fn;
    register uint64_t x1 __asm__("x1") = a1;
    register uint64_t x2 __asm__("x2") = a2;
    register uint64_t x3 __asm__("x3") = a3;
    __asm__ volatile("hvc #0" : "+r"(x0), "+r"(x1), "+r"(x2), "+r"(x3) : : "memory");
    return x0;
}

void gic_init(void)
{
    mmio_write32(GICD_PHYS + GICD_CTLR, 1);     /* forward group 0 interrupts */
}

/* Banked per CPU: SGIs and PPIs (INTIDs 0-31), the CPU interface. */
void gic_cpu_init(void)
{
    for (int i = 0; i < 32; i += 4)
        mmio_write32(GICD_PHYS + GICD_IPRIORITYR + i, 0xa0a0a0a0);
    mmio_write32(GICD_PHYS + GICD_ISENABLER, (1u << TIMER_INTID) | (1u << RESCHED_SGI));
    mmio_write32(GICC_PHYS + GICC_PMR, 0xf0);
    mmio_write32(GICC_PHYS + GICC_CTLR, 1);
}

void gic_eoi(uint32_t iar)
{
    mmio_write32(GICC_PHYS + 0x10, iar);
}

void gic_send_sgi(uint32_t cpu, uint32_t sgi)
{
    __asm__ volatile("dsb ishst" ::: "memory");
    mmio_write32(GICD_PHYS + GICD_SGIR, (1u << (16 + cpu)) | sgi);
}

void timer_start(void)
{
    uint64_t frq;
    __asm__ volatile("mrs %0, cntfrq_el0" : "=r"(frq));
    timer_interval = frq / TIMER_HZ;
    __asm__ volatile("msr cntv_tval_el0, %0\n\t"
                     "msr cntv_ctl_el0, %1\n\t"
                     "isb" : : "r"(timer_interval), "r"((uint64_t)1) : "memory");
}

void cpu_init(uint32_t id)
{
    struct cpu *c = &cpus[id];
    c->id = id;
    __asm__ volatile("mrs %0, mpidr_el1" : "=r"(c->mpidr));
    __asm__ volatile("msr tpidr_el1, %0" : : "r"(c) : "memory");
    gic_cpu_init();
}

uint32_t psci_cpu_count(void)
{
    uint32_t n = 1;
    while (n < MAX_CPUS && (int64_t)psci_call(PSCI_AFFINITY_INFO, n, 0, 0) >= 0)
        n++;
    return n;
}

void smp_start_aps(void)
{
    for (uint32_t id = 1; id < ncpus; id++) {
        int64_t r = (int64_t)psci_call(PSCI_CPU_ON, id, VIRT_TO_PHYS(secondary_start), id);
        uint64_t deadline = rdtsc() + 1000 * (tsc_per_ms ? tsc_per_ms : 62500);
        while (r == 0 && !cpus[id].online && rdtsc() < deadline)
            __asm__ volatile("yield");
        spin_lock(&console_lock);
        if (!cpus[id].online)
            kprintf("qmpprof-guest: cpu %u did not come up (PSCI %ld), using %u CPUs\n", id, r,
                    id);
        else
            kprintf("qmpprof-guest: cpu %u online\n", id);
        spin_unlock(&console_lock);
        if (!cpus[id].online) {
            ncpus = id;
            break;
        }
    }
}

/* C entry of the other CPUs (from ap_entry, on kernel_stacks[id]). */
CHAIN_FN void ap_main(uint64_t id)
{
    cpu_init((uint32_t)id);
    timer_start();
    cpus[id].idle_start = rdtsc();
    __atomic_store_n(&cpus[id].online, 1, __ATOMIC_RELEASE);
    cpu_idle();
}
