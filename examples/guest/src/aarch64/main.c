/* qmpprof example guest, AArch64 build: C entry point (from kernel_entry).
 *
 * Same sequence as src/main.c: serial, boot messages, the command line
 * (the DTB's /chosen/bootargs: QEMU -append "workload=user"), then either the
 * user workload or the kernel workload with the timer at TIMER_HZ. */
#include "proc.h"

enum workload_kind boot_workload = WORKLOAD_KERNEL;

static int token_is(const char *tok, int len, const char *word)
{
    int i = 0;
    for (; i < len && word[i]; i++)
        if (tok[i] != word[i])
            return 0;
    return i == len && word[i] == 0;
}

static void parse_cmdline(void)
{
    for (const char *t = boot_cmdline; *t;) {
        while (*t == ' ')
            t++;
        int len = 0;
        while (t[len] && t[len] != ' ')
            len++;
        if (len > 9 && token_is(t, 9, "workload=")) {
            if (token_is(t + 9, len - 9, "user"))
                boot_workload = WORKLOAD_USER;
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
    dtb_scan();
    kprintf("qmpprof-guest: memory %lu KiB at 0x%lx\n", boot_mem_size >> 10, boot_mem_start);
    uint64_t isar1;
    __asm__ volatile("mrs %0, id_aa64isar1_el1" : "=r"(isar1));
    kprintf("qmpprof-guest: pointer authentication %s (ID_AA64ISAR1_EL1 APA %lu API %lu)\n",
            (isar1 & 0xff0) ? "on" : "not implemented", (isar1 >> 4) & 0xf, (isar1 >> 8) & 0xf);
    parse_cmdline();

    gic_init();
    cpu_init(0);
    if (boot_workload == WORKLOAD_USER)
        user_workload_main();           /* never returns */

    timer_start();
    cpu_sti();

    /* Make sure the timer really ticks before announcing readiness. */
    uint64_t start = timer_ticks;
    while (timer_ticks < start + 2)
        __asm__ volatile("wfi" ::: "memory");
    kprintf("qmpprof-guest: timer running at %u Hz, workload_progress at %p\n",
            TIMER_HZ, (void *)&workload_progress);

    serial_puts("qmpprof-guest: ready\n");
    workload_loop();

    kprintf("qmpprof-guest: workload stopped after %lu rounds, halting\n",
            (uint64_t)workload_progress);
    for (;;)
        __asm__ volatile("msr daifclr, #2; wfi" ::: "memory");
}
