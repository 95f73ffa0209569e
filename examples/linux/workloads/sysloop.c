/* System-call heavy, so most of its time is in the kernel on behalf of a user task:
 *   main -> sysloop_loop -> read_zero   -> read     (4 KiB of /dev/zero: clear_user)
 *                        -> write_null  -> write    (4 KiB to /dev/null)
 *                        -> ask_parent  -> getppid  (the cheapest system call)
 * Frame pointers kept; glibc's wrappers have none, only CFI. */
#include <fcntl.h>
#include <unistd.h>

static volatile unsigned long sink;
static char buffer[4096];

__attribute__((noinline)) static void read_zero(int zero) {
    sink += (unsigned long)read(zero, buffer, sizeof buffer);
}

__attribute__((noinline)) static void write_null(int null) {
    sink += (unsigned long)write(null, buffer, sizeof buffer);
}

__attribute__((noinline)) static void ask_parent(void) {
    sink += (unsigned long)getppid();
}

__attribute__((noinline)) static void sysloop_loop(int zero, int null) {
    for (;;) {
        ask_parent();
        if (zero >= 0)
            read_zero(zero);
        if (null >= 0)
            write_null(null);
    }
}

int main(void) {
    sysloop_loop(open("/dev/zero", O_RDONLY), open("/dev/null", O_WRONLY));
}
