/* qmpprof example guest: shared declarations. */
#ifndef QMPPROF_GUEST_KERNEL_H
#define QMPPROF_GUEST_KERNEL_H

#include <stdint.h>
#include <stddef.h>
#include <stdarg.h>
#include "config.h"

/* Functions that must keep their own stack frame so that they appear in
 * backtraces: never inlined, never cloned (no .isra/.constprop suffixes). */
#define CHAIN_FN __attribute__((noinline, noclone, used))
/* Compiler barrier: also placed after calls so a call is never a tail call. */
#define barrier() __asm__ volatile("" ::: "memory")

/* ---- port I/O ---- */
static inline void outb(uint16_t port, uint8_t val)
{
    __asm__ volatile("outb %0, %1" : : "a"(val), "Nd"(port));
}
static inline uint8_t inb(uint16_t port)
{
    uint8_t v;
    __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}
static inline void outw(uint16_t port, uint16_t val)
{
    __asm__ volatile("outw %0, %1" : : "a"(val), "Nd"(port));
}
static inline void io_wait(void) { outb(0x80, 0); }
static inline void cpu_sti(void) { __asm__ volatile("sti" ::: "memory"); }
static inline void cpu_cli(void) { __asm__ volatile("cli" ::: "memory"); }

static inline uint64_t rdtsc(void)
{
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
}

/* ---- boot.S ---- */
extern uint32_t boot_multiboot_magic;
extern uint32_t boot_multiboot_info;
#ifndef __i386__
extern uint64_t kernel_pml4[512];    /* page tables (physical = virtual - KERNEL_VMA) */
extern uint64_t kernel_pdpt_high[512];
extern uint64_t boot_pdpt_low[512];
void kernel_entry(void);             /* 64-bit stub that calls kernel_main */
#else
/* src/i386/boot.S: two sets of kernel page tables, one used (boot option
 * paging=2level|pae, chosen by _start before paging is on). */
extern uint32_t boot_paging_pae;     /* 0: 2-level (CR4.PSE), 1: PAE */
extern uint32_t kernel_pgdir[1024];  /* 2-level: 4 MiB pages */
extern uint64_t kernel_pdpt[4];      /* PAE: PDPT[3] -> kernel_pd_pae */
extern uint64_t kernel_pd_pae[512];  /* PAE: 2 MiB pages */
void kernel_entry(void);             /* higher-half stub that calls kernel_main */
void paging_report(void);            /* i386/mm.c: prints "qmpprof-guest: paging ..." */
#endif

/* ---- per-CPU data (percpu.c) ---- */
extern uint8_t kernel_stacks[MAX_CPUS][KERNEL_STACK_SIZE];

/* ---- serial.c ---- */
void serial_init(void);
void serial_putc(char c);
void serial_puts(const char *s);
void kprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- interrupts (idt.c, isr.S, timer.c) ---- */
#ifndef __i386__
struct exception_frame {
    uint64_t r11, r10, r9, r8, rdi, rsi, rdx, rcx, rax;
    uint64_t rbp;
    uint64_t vector, error_code;
    uint64_t rip, cs, rflags, rsp, ss;
};
#else
struct exception_frame {             /* src/i386/isr.S, exception_common */
    uint32_t edx, ecx, eax;
    uint32_t esp;                    /* interrupted ESP (computed by the stub, any ring) */
    uint32_t ebp;
    uint32_t vector, error_code;
    uint32_t eip, cs, eflags;
    uint32_t user_esp, user_ss;      /* pushed by the CPU only when it came from ring 3 */
};
#endif
void idt_init(void);
void pic_init(void);
void pit_init(uint32_t hz);
void idt_load(void);
void exception_handler(struct exception_frame *f);
void timer_interrupt_handler(void);
extern volatile uint64_t timer_ticks;

/* ---- workload.c ---- */
extern volatile uint64_t workload_progress;
extern volatile uint32_t workload_stop;
void workload_loop(void);

/* ---- lib.c ---- */
void *memset(void *d, int c, size_t n);
void *memcpy(void *d, const void *s, size_t n);

void kernel_main(void);

/* ---- boot command line (main.c) ---- */
/* WORKLOAD_COMPAT (x86-64 only): the user workload with one of its processes
 * a 32-bit ELF32 program in compatibility mode (proc.c). */
enum workload_kind { WORKLOAD_KERNEL = 0, WORKLOAD_USER = 1, WORKLOAD_COMPAT = 2 };
extern enum workload_kind boot_workload;
extern char boot_cmdline[256];

#endif
