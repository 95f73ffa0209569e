/* CPU-bound in user space, never entering the kernel on its own:
 *   main -> crunch_loop -> mix
 * Built twice from this file: `crunch` keeps frame pointers, `crunchnofp` is
 * -O2 -fomit-frame-pointer (only its DWARF CFI can unwind it). The binary's file name
 * is the process's comm (exec takes it from the path), which is how tests find it. */
static volatile unsigned long sink;

__attribute__((noinline)) static unsigned long mix(unsigned long x) {
    for (int i = 0; i < 1000; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}

__attribute__((noinline)) static void crunch_loop(void) {
    unsigned long x = 1;
    for (;;)
        sink = x = mix(x);
}

int main(void) {
    crunch_loop();
}
