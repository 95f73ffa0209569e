/* qmpprof example guest: C entry point (called from kernel_entry in boot.S). */
#include "proc.h"

struct multiboot_info {
    uint32_t flags;
    uint32_t mem_lower;
    uint32_t mem_upper;
    uint32_t boot_device;
    uint32_t cmdline;           /* physical address, valid if flags & 4 */
};

/* Workload selected on the multiboot command line (QEMU: -append
 * "workload=user", x86-64 also "workload=compat"; QEMU passes "<kernel file>
 * <append string>").
 * Default: the kernel workload (workload.c). */
enum workload_kind boot_workload = WORKLOAD_KERNEL;
char boot_cmdline[256];

static int token_is(const char *tok, int len, const char *word)
{
    int i = 0;
    for (; i < len && word[i]; i++)
        if (tok[i] != word[i])
            return 0;
    return i == len && word[i] == 0;
}

static void parse_cmdline(const struct multiboot_info *mbi)
{
    if (!(mbi->flags & 4))
        return;
    const char *src = (const char *)(KERNEL_VMA + mbi->cmdline);
    int n = 0;
    while (n < (int)sizeof(boot_cmdline) - 1 && src[n]) {
        boot_cmdline[n] = src[n];
        n++;
    }
    boot_cmdline[n] = 0;
    for (const char *t = boot_cmdline; *t;) {
        while (*t == ' ')
            t++;
        int len = 0;
        while (t[len] && t[len] != ' ')
            len++;
        if (len > 9 && token_is(t, 9, "workload=")) {
            if (token_is(t + 9, len - 9, "user"))
                boot_workload = WORKLOAD_USER;
#ifndef __i386__
            else if (token_is(t + 9, len - 9, "compat"))
                boot_workload = WORKLOAD_COMPAT;
#endif
            else if (token_is(t + 9, len - 9, "kernel"))
                boot_workload = WORKLOAD_KERNEL;
            else
                kprintf("qmpprof-guest: unknown workload in '%s', using kernel\n",
                        boot_cmdline);
        }
        t += len;
    }
}

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
        parse_cmdline(mbi);
    } else {
        kprintf("qmpprof-guest: not started by multiboot (eax=%x)\n",
                boot_multiboot_magic);
    }
#ifdef __i386__
    paging_report();                    /* "qmpprof-guest: paging 2level|pae" */
#endif

    if (boot_workload == WORKLOAD_USER || boot_workload == WORKLOAD_COMPAT)
        user_workload_main();           /* never returns */

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
