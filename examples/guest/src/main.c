/* qmpprof example guest: C entry point (called from kernel_entry in boot.S). */
#include "kernel.h"

struct multiboot_info {
    uint32_t flags;
    uint32_t mem_lower;
    uint32_t mem_upper;
};

void kernel_main(void)
{
    serial_init();
    kprintf("qmpprof-guest: booting, variant %s\n", GUEST_VARIANT);

    if (boot_multiboot_magic == 0x2badb002) {
        const struct multiboot_info *mbi =
            (const struct multiboot_info *)(KERNEL_VMA + boot_multiboot_info);
        if (mbi->flags & 1)
            kprintf("qmpprof-guest: memory %u KiB low, %u KiB high\n",
                    mbi->mem_lower, mbi->mem_upper);
    } else {
        kprintf("qmpprof-guest: not started by multiboot (eax=%x)\n",
                boot_multiboot_magic);
    }

    idt_init();
    pic_init();
    pit_init(TIMER_HZ);
    cpu_sti();

    /* Make sure the timer really ticks before announcing readiness. */
    uint64_t start = timer_ticks;
    while (timer_ticks < start + 2)
        __asm__ volatile("hlt" ::: "memory");
    kprintf("qmpprof-guest: timer running at %u Hz, workload_progress at %p\n",
            TIMER_HZ, (void *)&workload_progress);

    serial_puts("qmpprof-guest: ready\n");
    workload_loop();

    kprintf("qmpprof-guest: workload stopped after %lu rounds, halting\n",
            (uint64_t)workload_progress);
    for (;;)
        __asm__ volatile("sti; hlt" ::: "memory");
}
