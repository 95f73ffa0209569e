/* System calls the way i386 glibc makes them: through the vDSO's __kernel_vsyscall
 * (AT_SYSINFO), which enters the kernel with `sysenter` (entry_SYSENTER_32), not int $0x80:
 *   _start -> main -> sysenter_loop -> ask_parent -> vdso_getppid -> __kernel_vsyscall
 *                                   -> read_zero -> vdso_read -> __kernel_vsyscall
 * __kernel_vsyscall pushes ecx, edx and ebp and sets ebp = esp before sysenter: a plain
 * frame-pointer walk from there takes the saved edx for a return address; the vDSO's
 * .eh_frame (GDB: add-symbol-file-from-memory vdso_base) describes it. The vDSO's address
 * is in `vdso_base` (AT_SYSINFO_EHDR) for the oracle to read. */
#include "../sys32.h"

static char buffer[4096];
static unsigned long vsyscall;
unsigned long vdso_base;

NOINLINE static int vdso_getppid(void) {
    long ret;
    __asm__ volatile("call *%1" : "=a"(ret) : "m"(vsyscall), "a"(NR_getppid) : "memory");
    return ret;
}

NOINLINE static int vdso_read(int fd, void *to, size_t count) {
    long ret;
    __asm__ volatile("call *%1"
                     : "=a"(ret)
                     : "m"(vsyscall), "a"(NR_read), "b"(fd), "c"(to), "d"(count)
                     : "memory");
    return ret;
}

NOINLINE static int ask_parent(void) { return vdso_getppid(); }
NOINLINE static int read_zero(int fd) { return vdso_read(fd, buffer, sizeof buffer); }

NOINLINE static void sysenter_loop(int zero) {
    for (;;) {
        ask_parent();
        read_zero(zero);
    }
}

int main(void) {
    vsyscall = auxv(32);
    vdso_base = auxv(33);
    int zero = open("/dev/zero", O_RDONLY);
    if (vsyscall == 0 || zero < 0)
        return 1;
    sysenter_loop(zero);
    return 0;
}
