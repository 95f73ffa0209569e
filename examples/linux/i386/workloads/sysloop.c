/* System calls through int $0x80, in a loop:
 *   _start -> main -> sysloop_loop -> ask_parent -> getppid
 *                                  -> read_zero -> read   (4 KiB of /dev/zero)
 *                                  -> write_null -> write (4 KiB to /dev/null) */
#include "../sys32.h"

static char buffer[4096];

NOINLINE static int ask_parent(void) { return getppid(); }
NOINLINE static int read_zero(int fd) { return read(fd, buffer, sizeof buffer); }
NOINLINE static int write_null(int fd) { return write(fd, buffer, sizeof buffer); }

NOINLINE static void sysloop_loop(int zero, int null) {
    for (;;) {
        ask_parent();
        read_zero(zero);
        write_null(null);
    }
}

int main(void) {
    int zero = open("/dev/zero", O_RDONLY), null = open("/dev/null", O_WRONLY);
    if (zero < 0 || null < 0)
        return 1;
    sysloop_loop(zero, null);
    return 0;
}
