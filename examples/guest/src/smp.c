/* qmpprof example guest: per-CPU setup, local APIC, AP startup (user workload).
 *
 * CPU numbers are LAPIC IDs; with a plain `-smp N` QEMU numbers them 0..N-1,
 * the same as its vCPU index (QMP cpu-index, gdbstub thread N+1), so
 * cpu_current[i] / cpus[i] describe QEMU's CPU #i. The number of CPUs comes
 * from QEMU's fw_cfg (FW_CFG_NB_CPUS).
 *
 * Every CPU gets its own GDT (kernel code/data, user data/code, its TSS;
 * x86-64 also a 32-bit user code segment for compatibility mode) and
 * TSS (RSP0 = kernel stack of the process it runs, set on every switch), and
 * its own LAPIC timer at TIMER_HZ on TIMER_VECTOR (0x20, the same stub and C
 * handler as the PIT in the kernel workload). The LAPIC timer and the TSC are
 * calibrated against the PIT at boot (lapic_calibrate). */
#include "proc.h"

#define LAPIC_ID        0x020
#define LAPIC_TPR       0x080
#define LAPIC_EOI       0x0b0
#define LAPIC_SVR       0x0f0
#define LAPIC_ICR_LO    0x300
#define LAPIC_ICR_HI    0x310
#define LAPIC_LVT_TIMER 0x320
#define LAPIC_LVT_LINT0 0x350
#define LAPIC_LVT_ERROR 0x370
#define LAPIC_TICR      0x380
#define LAPIC_TCCR      0x390
#define LAPIC_TDCR      0x3e0

#define LVT_MASKED      (1u << 16)
#define LVT_PERIODIC    (1u << 17)

struct cpu cpus[MAX_CPUS];
uint32_t ncpus = 1;
uint64_t tsc_per_ms;
static uint32_t lapic_count_per_tick;

static inline __attribute__((always_inline)) uint32_t lapic_read(uint32_t reg)
{
    return *(volatile uint32_t *)(LAPIC_VIRT + reg);
}

static inline __attribute__((always_inline)) void lapic_write(uint32_t reg, uint32_t v)
{
    *(volatile uint32_t *)(LAPIC_VIRT + reg) = v;
}

uint32_t lapic_id(void)
{
    return lapic_read(LAPIC_ID) >> 24;
}

void lapic_eoi(void)
{
    lapic_write(LAPIC_EOI, 0);
}

static void lapic_wait_icr(void)
{
    while (lapic_read(LAPIC_ICR_LO) & (1u << 12))
        __asm__ volatile("pause");
}

void lapic_send_ipi(uint32_t apic_id, uint32_t vector)
{
    lapic_write(LAPIC_ICR_HI, apic_id << 24);
    lapic_write(LAPIC_ICR_LO, vector | 0x4000);    /* fixed, assert */
    lapic_wait_icr();
}

void udelay(uint64_t us)
{
    uint64_t end = rdtsc() + us * tsc_per_ms / 1000;
    while (rdtsc() < end)
        __asm__ volatile("pause");
}

uint32_t fw_cfg_cpu_count(void)
{
    char sig[4];
    outw(0x510, 0x0000);                /* FW_CFG_SIGNATURE */
    for (int i = 0; i < 4; i++)
        sig[i] = (char)inb(0x511);
    if (sig[0] != 'Q' || sig[1] != 'E' || sig[2] != 'M' || sig[3] != 'U')
        return 1;
    outw(0x510, 0x0005);                /* FW_CFG_NB_CPUS, 16 bit LE */
    uint32_t n = inb(0x511);
    n |= (uint32_t)inb(0x511) << 8;
    return n ? n : 1;
}

#ifdef __i386__
/* A legacy segment descriptor (base, 20-bit limit, access byte, flags nibble). */
static uint64_t gdt_desc(uint32_t base, uint32_t limit, uint32_t access, uint32_t flags)
{
    return (limit & 0xffff) | ((uint64_t)(base & 0xffffff) << 16) | ((uint64_t)access << 40) |
           ((uint64_t)((limit >> 16) & 0xf) << 48) | ((uint64_t)flags << 52) |
           ((uint64_t)(base >> 24) << 56);
}
#endif

/* GDT + TSS + IDT + LAPIC of the calling CPU (id = its LAPIC ID). */
void cpu_init(uint32_t id)
{
    struct cpu *c = &cpus[id];
    c->id = id;
#ifdef __i386__
    /* i386: 0x08/0x10 kernel code/data, 0x18/0x20 user data/code (flat, 4 GiB),
     * 0x28 this CPU's TSS, 0x30 the per-CPU segment for %gs (base &cpus[id],
     * DPL 3 so that an iret to ring 3 keeps %gs loaded; its page is
     * supervisor-only). The kernel runs with %ds = %es = USER_DS (flat, as
     * Linux/i386 did), which an iret to ring 3 keeps too, so the interrupt
     * stubs never reload data segments. */
    c->gdt[0] = 0;
    c->gdt[1] = 0x00cf9a000000ffffULL;  /* 0x08 kernel code, 32-bit */
    c->gdt[2] = 0x00cf92000000ffffULL;  /* 0x10 kernel data */
    c->gdt[3] = 0x00cff2000000ffffULL;  /* 0x18 user data, DPL 3 */
    c->gdt[4] = 0x00cffa000000ffffULL;  /* 0x20 user code, 32-bit, DPL 3 */
    c->gdt[5] = gdt_desc((uint32_t)&c->tss, sizeof(struct tss32) - 1, 0x89, 0); /* 32-bit TSS */
    c->gdt[6] = gdt_desc((uint32_t)c, sizeof(struct cpu) - 1, 0xf2, 0x4);      /* %gs, DPL 3 */
    c->gdt[7] = 0;
    c->tss.esp0 = (uintptr_t)kernel_stacks[id] + KERNEL_STACK_SIZE;
    c->tss.ss0 = KERNEL_DS;
    c->tss.iomap_base = sizeof(struct tss32);   /* no I/O bitmap: ring 3 has no port access */

    struct {
        uint16_t limit;
        uint32_t base;
    } __attribute__((packed)) p = { sizeof(c->gdt) - 1, (uint32_t)c->gdt };
    __asm__ volatile("lgdt %0\n\t"
                     "movl %1, %%eax\n\t"
                     "movl %%eax, %%ds\n\t"
                     "movl %%eax, %%es\n\t"
                     "movl %2, %%eax\n\t"
                     "movl %%eax, %%ss\n\t"
                     "movl %3, %%eax\n\t"
                     "movl %%eax, %%gs\n\t"
                     "xorl %%eax, %%eax\n\t"
                     "movl %%eax, %%fs\n\t"
                     "ljmp %4, $1f\n"
                     "1:\tltr %w5"
                     : : "m"(p), "i"(USER_DS), "i"(KERNEL_DS), "i"(PERCPU_SEL), "i"(KERNEL_CS),
                       "r"((uint16_t)TSS_SEL) : "eax", "memory");
    idt_load();
#else
    c->gdt[0] = 0;
    c->gdt[1] = 0x00af9a000000ffffULL;  /* 0x08 kernel code, 64-bit */
    c->gdt[2] = 0x00cf92000000ffffULL;  /* 0x10 kernel data */
    c->gdt[3] = 0x00cff2000000ffffULL;  /* 0x18 user data, DPL 3 */
    c->gdt[4] = 0x00affa000000ffffULL;  /* 0x20 user code, 64-bit, DPL 3 */
    uint64_t base = (uint64_t)&c->tss;
    uint64_t limit = sizeof(struct tss64) - 1;
    c->gdt[5] = (limit & 0xffff) | ((base & 0xffffff) << 16) | (0x89ULL << 40) |
                (((limit >> 16) & 0xf) << 48) | (((base >> 24) & 0xff) << 56);
    c->gdt[6] = base >> 32;             /* 0x28: 64-bit available TSS */
    c->gdt[7] = 0x00cffa000000ffffULL;  /* 0x38 user code, 32-bit (L=0, D=1), DPL 3:
                                           compatibility mode (workload=compat) */
    c->tss.rsp0 = (uint64_t)kernel_stacks[id] + KERNEL_STACK_SIZE;
    c->tss.iomap_base = sizeof(struct tss64);   /* no I/O bitmap: ring 3 has no port access */

    /* %ds/%es: KERNEL_DS, which the first iretq to ring 3 turns into a null
     * selector (DPL 0 < CPL 3); 64-bit mode ignores them. Code in
     * compatibility mode does not: its data accesses go through %ds/%es,
     * and a null one faults. So with workload=compat every CPU runs with
     * %ds = %es = USER_DS (flat 32-bit data, DPL 3, as %ss of ring 3 uses),
     * which an iretq to ring 3 keeps and nothing else reloads. */
    uint32_t data_sel = boot_workload == WORKLOAD_COMPAT ? USER_DS : KERNEL_DS;
    struct {
        uint16_t limit;
        uint64_t base;
    } __attribute__((packed)) p = { sizeof(c->gdt) - 1, (uint64_t)c->gdt };
    __asm__ volatile("lgdt %0\n\t"
                     "movl %1, %%eax\n\t"
                     "movl %%eax, %%ss\n\t"
                     "movl %2, %%eax\n\t"
                     "movl %%eax, %%ds\n\t"
                     "movl %%eax, %%es\n\t"
                     "ltr %w3"
                     : : "m"(p), "i"(KERNEL_DS), "r"(data_sel), "r"((uint16_t)TSS_SEL)
                     : "rax", "memory");
    idt_load();
    /* IA32_GS_BASE = &cpus[id]: cpu_id() reads %gs:0 */
    __asm__ volatile("wrmsr" : : "c"(0xc0000101), "a"((uint32_t)(uint64_t)c),
                     "d"((uint32_t)((uint64_t)c >> 32)));
#endif

    lapic_write(LAPIC_TPR, 0);
    lapic_write(LAPIC_SVR, 0x100 | SPURIOUS_VECTOR);    /* software enable */
    lapic_write(LAPIC_LVT_TIMER, LVT_MASKED | TIMER_VECTOR);
    lapic_write(LAPIC_LVT_ERROR, LVT_MASKED | SPURIOUS_VECTOR);
    if (id != 0)
        lapic_write(LAPIC_LVT_LINT0, LVT_MASKED);       /* the 8259 talks to CPU 0 only */
}

/* Latch and read PIT channel 0; returns the TSC right after the latch (the
 * moment the count was taken, even if the port access had to wait). */
static uint64_t pit_read(uint32_t *count)
{
    outb(0x43, 0x00);                   /* latch channel 0 */
    uint64_t t = rdtsc();
    uint32_t lo = inb(0x40);
    uint32_t hi = inb(0x40);
    *count = lo | (hi << 8);
    return t;
}

static void sort_u64(uint64_t *v, int n)
{
    for (int i = 1; i < n; i++) {
        uint64_t x = v[i];
        int j = i - 1;
        while (j >= 0 && v[j] > x) {
            v[j + 1] = v[j];
            j--;
        }
        v[j + 1] = x;
    }
}

/* BSP only, PIT channel 0 running in mode 2 at TIMER_HZ (pit_init).
 * Calibrate the TSC and the LAPIC timer against the PIT by polling its
 * counter (no interrupts involved, so interrupt latency and host stalls do
 * not matter: a stall advances the TSC and the PIT alike). CALIBRATE_WINDOWS
 * windows of CALIBRATE_PIT_COUNTS PIT counts (~8.4 ms) each; the median is
 * used, so a window in which the PIT wrapped unseen (a host stall of more
 * than 10 ms) does not count. */
#define PIT_HZ                  1193182
#define CALIBRATE_WINDOWS       16
#define CALIBRATE_PIT_COUNTS    10000
void lapic_calibrate(void)
{
    uint32_t div = (PIT_HZ + TIMER_HZ / 2) / TIMER_HZ;     /* as pit_init() */
    uint64_t tsc_r[CALIBRATE_WINDOWS], lapic_r[CALIBRATE_WINDOWS];
    lapic_write(LAPIC_TDCR, 0x3);                       /* divide by 16 */
    lapic_write(LAPIC_LVT_TIMER, LVT_MASKED | TIMER_VECTOR);
    lapic_write(LAPIC_TICR, 0xffffffffu);
    for (int w = 0; w < CALIBRATE_WINDOWS; w++) {
        uint32_t l0 = lapic_read(LAPIC_TCCR);
        uint32_t prev, cur;
        uint64_t t0 = pit_read(&prev), t1 = t0;
        uint64_t elapsed = 0;
        while (elapsed < CALIBRATE_PIT_COUNTS) {
            t1 = pit_read(&cur);
            elapsed += prev >= cur ? prev - cur : prev + div - cur;
            prev = cur;
        }
        uint32_t l1 = lapic_read(LAPIC_TCCR);
        tsc_r[w] = (t1 - t0) * PIT_HZ / (elapsed * 1000);          /* per ms */
        lapic_r[w] = (uint64_t)(l0 - l1) * PIT_HZ / (elapsed * TIMER_HZ); /* per tick */
    }
    lapic_write(LAPIC_TICR, 0);
    sort_u64(tsc_r, CALIBRATE_WINDOWS);
    sort_u64(lapic_r, CALIBRATE_WINDOWS);
    tsc_per_ms = tsc_r[CALIBRATE_WINDOWS / 2];
    lapic_count_per_tick = (uint32_t)lapic_r[CALIBRATE_WINDOWS / 2];
    kprintf("qmpprof-guest: LAPIC timer %u counts per tick (divide 16), TSC %lu kHz\n",
            lapic_count_per_tick, tsc_per_ms);
}

void lapic_timer_start(void)
{
    lapic_write(LAPIC_TDCR, 0x3);
    lapic_write(LAPIC_LVT_TIMER, LVT_PERIODIC | TIMER_VECTOR);
    lapic_write(LAPIC_TICR, lapic_count_per_tick);
}

/* Application processors: INIT-SIPI-SIPI, one after the other. The real-mode
 * trampoline (ap_boot.S) is copied to AP_TRAMPOLINE_PHYS; it goes straight
 * to long mode with ap_boot_pml4() (i386: to protected mode with paging, in
 * the boot's paging mode), loads the stack kernel_stacks[id] and jumps to
 * ap_entry -> ap_main -> cpu_idle. The trampoline's fields are 64-bit in
 * both builds (i386 reads the low half). */
void smp_start_aps(void)
{
    extern char ap_trampoline_start[], ap_trampoline_end[];
    extern char ap_tramp_cr3[], ap_tramp_stack[], ap_tramp_entry[];
    uint8_t *t = PHYS_TO_VIRT(AP_TRAMPOLINE_PHYS);
    memcpy(t, ap_trampoline_start, (size_t)(ap_trampoline_end - ap_trampoline_start));
    *(uint64_t *)(t + (ap_tramp_cr3 - ap_trampoline_start)) = ap_boot_pml4();
    *(uint64_t *)(t + (ap_tramp_entry - ap_trampoline_start)) = (uintptr_t)ap_entry;

    for (uint32_t id = 1; id < ncpus; id++) {
        *(uint64_t *)(t + (ap_tramp_stack - ap_trampoline_start)) =
            (uintptr_t)kernel_stacks[id] + KERNEL_STACK_SIZE;
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        lapic_write(LAPIC_ICR_HI, id << 24);
        lapic_write(LAPIC_ICR_LO, 0x00004500);          /* INIT, assert */
        lapic_wait_icr();
        udelay(10000);
        for (int sipi = 0; sipi < 2 && !cpus[id].online; sipi++) {
            lapic_write(LAPIC_ICR_HI, id << 24);
            lapic_write(LAPIC_ICR_LO, 0x00004600 | (AP_TRAMPOLINE_PHYS >> 12));
            lapic_wait_icr();
            udelay(sipi == 0 ? 1000 : 200);
        }
        uint64_t deadline = rdtsc() + 1000 * tsc_per_ms;
        while (!cpus[id].online && rdtsc() < deadline)
            __asm__ volatile("pause");
        spin_lock(&console_lock);
        if (!cpus[id].online)
            kprintf("qmpprof-guest: cpu %u did not come up, using %u CPUs\n", id, id);
        else
            kprintf("qmpprof-guest: cpu %u online\n", id);
        spin_unlock(&console_lock);
        if (!cpus[id].online) {
            ncpus = id;
            break;
        }
    }
}

/* C entry of an application processor (from ap_entry, on kernel_stacks[id]). */
CHAIN_FN void ap_main(void)
{
    uint32_t id = lapic_id();
    cpu_init(id);
    lapic_timer_start();
    cpus[id].idle_start = rdtsc();
    __atomic_store_n(&cpus[id].online, 1, __ATOMIC_RELEASE);
    cpu_idle();
}
