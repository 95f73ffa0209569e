/* Reads the clock in a loop, as programs that time their work do: most of its time is
 * in the vDSO (user code the kernel maps into every process), none in the kernel:
 *   main -> time_loop -> read_clock -> clock_gettime (glibc) -> the vDSO's
 * Frame pointers kept; the vDSO and glibc's wrapper have none, only CFI. */
#include <time.h>

static volatile long sink;

__attribute__((noinline)) static void read_clock(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    sink += now.tv_nsec;
}

__attribute__((noinline)) static void time_loop(void) {
    for (;;)
        read_clock();
}

int main(void) {
    time_loop();
}
