/* A few lines of C runtime for the i386 Linux guest's static programs: no libc, so they
 * build with the host's gcc -m32 alone (no gcc-multilib / libc6-dev-i386 needed).
 * System calls go through `int $0x80` (entry_INT80_32 in the kernel), never the vDSO's
 * sysenter. Each wrapper is its own noinline function with a frame pointer, like libc's
 * read() or getppid(): a user stack sampled in a system call ends in the wrapper, and
 * the wrapper's frame links to its caller's.
 *
 * _start enters main with %ebp = 0 (the end of the frame-pointer chain) and a 16-byte
 * aligned stack; main's return value is exit_group's status. It keeps the initial stack
 * pointer (argc, argv, envp, auxv) in `initial_stack` for auxv() below. */
#ifndef SYS32_H
#define SYS32_H

typedef unsigned int size_t;
typedef int ssize_t;

#define NR_exit 1
#define NR_fork 2
#define NR_read 3
#define NR_write 4
#define NR_open 5
#define NR_close 6
#define NR_execve 11
#define NR_mount 21
#define NR_getpid 20
#define NR_pause 29
#define NR_getppid 64
#define NR_wait4 114
#define NR_uname 122
#define NR_nanosleep 162
#define NR_exit_group 252
#define NR_finit_module 350

#define O_RDONLY 0
#define O_WRONLY 1
#define O_CLOEXEC 02000000

/* noipa: no clones (.isra, .constprop) and no local register calling conventions:
 * every function is called as its name says, arguments on the stack. */
#define NOINLINE __attribute__((noinline, noipa))

static inline long syscall6(long n, long a, long b, long c, long d, long e) {
    long ret;
    __asm__ volatile("int $0x80"
                     : "=a"(ret)
                     : "a"(n), "b"(a), "c"(b), "d"(c), "S"(d), "D"(e)
                     : "memory");
    return ret;
}
#define syscall3(n, a, b, c) syscall6((n), (long)(a), (long)(b), (long)(c), 0, 0)

NOINLINE ssize_t read(int fd, void *buffer, size_t count) {
    return syscall3(NR_read, fd, buffer, count);
}
NOINLINE ssize_t write(int fd, const void *buffer, size_t count) {
    return syscall3(NR_write, fd, buffer, count);
}
NOINLINE int open(const char *path, int flags) { return syscall3(NR_open, path, flags, 0); }
NOINLINE int close(int fd) { return syscall3(NR_close, fd, 0, 0); }
NOINLINE int getppid(void) { return syscall3(NR_getppid, 0, 0, 0); }
NOINLINE int fork(void) { return syscall3(NR_fork, 0, 0, 0); }
NOINLINE int execve(const char *path, char *const argv[], char *const envp[]) {
    return syscall3(NR_execve, path, argv, envp);
}
NOINLINE int wait4(int pid, int *status, int options) {
    return syscall6(NR_wait4, pid, (long)status, options, 0, 0);
}
NOINLINE int pause(void) { return syscall3(NR_pause, 0, 0, 0); }
NOINLINE int mount(const char *source, const char *target, const char *type) {
    return syscall6(NR_mount, (long)source, (long)target, (long)type, 0, 0);
}
struct timespec32 { long tv_sec, tv_nsec; };
NOINLINE int nanosleep(const struct timespec32 *request, struct timespec32 *remain) {
    return syscall3(NR_nanosleep, request, remain, 0);
}
__attribute__((noreturn)) void exit(int status) {
    for (;;)
        syscall3(NR_exit_group, status, 0, 0);
}

/* gcc may emit calls to these even with -ffreestanding. */
void *memset(void *to, int c, size_t n) {
    unsigned char *p = to;
    while (n--)
        *p++ = (unsigned char)c;
    return to;
}
void *memcpy(void *to, const void *from, size_t n) {
    unsigned char *p = to;
    const unsigned char *q = from;
    while (n--)
        *p++ = *q++;
    return to;
}

static size_t length(const char *s) {
    size_t n = 0;
    while (s[n])
        n++;
    return n;
}
static void say(const char *s) { write(1, s, length(s)); }
static void say_number(unsigned long value, int base) {
    char digits[16];
    int n = sizeof digits;
    do {
        digits[--n] = "0123456789abcdef"[value % base];
        value /= base;
    } while (value != 0);
    write(1, digits + n, sizeof digits - n);
}

int main(void);

/* The stack as the kernel left it for _start. */
long *initial_stack;

/* The auxiliary vector's value for `type` (AT_SYSINFO 32: __kernel_vsyscall's address,
 * AT_SYSINFO_EHDR 33: the vDSO's ELF header); 0 if there is none. */
static unsigned long auxv(unsigned long type) {
    long *at = initial_stack;
    at += 1 + at[0] + 1;  /* argc, argv[], NULL */
    while (*at)           /* envp[] */
        at++;
    for (unsigned long *pair = (unsigned long *)(at + 1); pair[0] != 0; pair += 2)
        if (pair[0] == type)
            return pair[1];
    return 0;
}

__asm__(".text\n"
        ".globl _start\n"
        ".type _start, @function\n"
        "_start:\n"
        "    movl %esp, initial_stack\n"
        "    xorl %ebp, %ebp\n"
        "    andl $-16, %esp\n"
        "    call main\n"
        "    movl %eax, %ebx\n"
        "    movl $252, %eax\n"
        "    int $0x80\n"
        "    hlt\n"
        ".size _start, .-_start\n");

#endif
