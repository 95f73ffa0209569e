/* Mostly asleep: _start -> main -> doze -> nanosleep (20 ms). */
#include "../sys32.h"

NOINLINE static void doze(void) {
    struct timespec32 request = {0, 20 * 1000 * 1000};
    nanosleep(&request, 0);
}

int main(void) {
    for (;;)
        doze();
    return 0;
}
