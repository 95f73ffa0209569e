/* qmpprof example guest: IDT, 8259 PIC, 8253/8254 PIT, exception reporting. */
#include "proc.h"

#ifndef __i386__
struct idt_entry {
    uint16_t offset_low;
    uint16_t selector;
    uint8_t ist;
    uint8_t type_attr;
    uint16_t offset_mid;
    uint32_t offset_high;
    uint32_t reserved;
} __attribute__((packed));

struct idt_ptr {
    uint16_t limit;
    uint64_t base;
} __attribute__((packed));
#else
struct idt_entry {
    uint16_t offset_low;
    uint16_t selector;
    uint8_t zero;
    uint8_t type_attr;
    uint16_t offset_high;
} __attribute__((packed));

struct idt_ptr {
    uint16_t limit;
    uint32_t base;
} __attribute__((packed));
#endif

static struct idt_entry idt[256] __attribute__((aligned(16)));

extern const uintptr_t exception_stub_table[32];
void timer_irq_entry(void);
void irq_ignore_entry(void);

static void idt_set_gate_dpl(int vec, uintptr_t handler, unsigned dpl)
{
    struct idt_entry *e = &idt[vec];
#ifndef __i386__
    e->offset_low = (uint16_t)handler;
    e->selector = KERNEL_CS;
    e->ist = 0;
    e->type_attr = (uint8_t)(0x8e | (dpl << 5)); /* present, DPL, 64-bit interrupt gate */
    e->offset_mid = (uint16_t)(handler >> 16);
    e->offset_high = (uint32_t)(handler >> 32);
    e->reserved = 0;
#else
    e->offset_low = (uint16_t)handler;
    e->selector = KERNEL_CS;
    e->zero = 0;
    e->type_attr = (uint8_t)(0x8e | (dpl << 5)); /* present, DPL, 32-bit interrupt gate */
    e->offset_high = (uint16_t)(handler >> 16);
#endif
}

static void idt_set_gate(int vec, uintptr_t handler)
{
    idt_set_gate_dpl(vec, handler, 0);
}

void idt_init(void)
{
    for (int v = 0; v < 32; v++)
        idt_set_gate(v, exception_stub_table[v]);
    for (int v = 0x21; v < 0x30; v++)
        idt_set_gate(v, (uintptr_t)irq_ignore_entry);
    idt_set_gate(TIMER_VECTOR, (uintptr_t)timer_irq_entry);
    /* user workload only (never raised in the kernel workload) */
    idt_set_gate(RESCHED_VECTOR, (uintptr_t)resched_irq_entry);
    idt_set_gate(SPURIOUS_VECTOR, (uintptr_t)irq_ignore_entry);
    idt_set_gate_dpl(SYSCALL_VECTOR, (uintptr_t)syscall_entry, 3);
    idt_load();
}

void idt_load(void)
{
    struct idt_ptr p = { sizeof(idt) - 1, (uintptr_t)idt };
    __asm__ volatile("lidt %0" : : "m"(p));
}

void pic_init(void)
{
    outb(0x20, 0x11); io_wait();    /* ICW1: init, ICW4 needed */
    outb(0xa0, 0x11); io_wait();
    outb(0x21, 0x20); io_wait();    /* ICW2: master vectors 0x20-0x27 */
    outb(0xa1, 0x28); io_wait();    /*       slave vectors 0x28-0x2f */
    outb(0x21, 0x04); io_wait();    /* ICW3: slave on IRQ2 */
    outb(0xa1, 0x02); io_wait();
    outb(0x21, 0x01); io_wait();    /* ICW4: 8086 mode */
    outb(0xa1, 0x01); io_wait();
    outb(0x21, 0xfe);               /* unmask IRQ0 (PIT) only */
    outb(0xa1, 0xff);
}

void pit_init(uint32_t hz)
{
    uint32_t divisor = (1193182 + hz / 2) / hz;
    outb(0x43, 0x34);               /* channel 0, lo/hi byte, mode 2 */
    outb(0x40, (uint8_t)divisor);
    outb(0x40, (uint8_t)(divisor >> 8));
}

void exception_handler(struct exception_frame *f)
{
    uintptr_t cr2;
    __asm__ volatile("mov %%cr2, %0" : "=r"(cr2));
    if ((f->cs & 3) == 3 && sched_running) {
        /* user workload: a process faulted in ring 3, kill it */
        struct process *p = cpu_current[cpu_id()];
        spin_lock(&console_lock);
#ifndef __i386__
        kprintf("\nqmpprof-guest: EXCEPTION in process %d (%s): vector=%lu error=%lx "
                "rip=%lx rsp=%lx cr2=%lx\n", p ? p->pid : -1, p ? p->name : "?",
                f->vector, f->error_code, f->rip, f->rsp, cr2);
#else
        kprintf("\nqmpprof-guest: EXCEPTION in process %d (%s): vector=%u error=%x "
                "eip=%x esp=%x cr2=%x\n", p ? p->pid : -1, p ? p->name : "?",
                f->vector, f->error_code, f->eip, f->esp, cr2);
#endif
        spin_unlock(&console_lock);
        sys_exit((uint64_t)-1);
    }
#ifndef __i386__
    kprintf("\nqmpprof-guest: EXCEPTION vector=%lu error=%lx rip=%lx rsp=%lx "
            "rbp=%lx cr2=%lx\n",
            f->vector, f->error_code, f->rip, f->rsp, f->rbp, cr2);
#else
    kprintf("\nqmpprof-guest: EXCEPTION vector=%u error=%x eip=%x cs=%x eflags=%x esp=%x "
            "ebp=%x cr2=%x\n",
            f->vector, f->error_code, f->eip, f->cs, f->eflags, f->esp, f->ebp, cr2);
#endif
    for (;;)
        __asm__ volatile("cli; hlt");
}
