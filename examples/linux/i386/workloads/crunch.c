/* CPU-bound in user space, never entering the kernel on its own:
 *   _start -> main -> crunch_loop -> mix
 * Built twice: `crunch` keeps frame pointers, `crunchnofp` is -fomit-frame-pointer
 * (only its DWARF CFI, .eh_frame, unwinds it). A 32-bit LCG: no 64-bit arithmetic, so
 * no libgcc. */
#include "../sys32.h"

static volatile unsigned long sink;

NOINLINE static unsigned long mix(unsigned long x) {
    for (int i = 0; i < 1000; i++)
        x = x * 1664525UL + 1013904223UL;
    return x;
}

NOINLINE static void crunch_loop(void) {
    unsigned long x = 1;
    for (;;)
        sink = x = mix(x);
}

int main(void) {
    crunch_loop();
    return 0;
}
