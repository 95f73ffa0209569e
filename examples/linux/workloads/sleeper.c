/* Mostly asleep, so some vCPU time is idle or in the scheduler:
 *   main -> doze -> nanosleep (20 ms) */
#include <time.h>

__attribute__((noinline)) static void doze(void) {
    struct timespec pause = {0, 20 * 1000 * 1000};
    nanosleep(&pause, NULL);
}

int main(void) {
    for (;;)
        doze();
}
