/* CPU-bound in user space, never entering the kernel on its own:
 *   main -> crunch_loop -> mix
 * Built twice from this file: `crunch` keeps frame pointers, `crunchnofp` is
 * -O2 -fomit-frame-pointer (only its DWARF CFI can unwind it). The binary's file name
 * is the process's comm (exec takes it from the path), which is how tests find it. */
static volatile unsigned long sink;

/* The guest's own work counter for bench/linux_perturbation.py: `rounds` counts the
 * calls of mix (1000 LCG steps each). The host finds it in the guest's RAM file by
 * `marker` (the process's copy is the one whose count moves; the program file's copy in
 * the initramfs stays 0) and reads it there, never through QEMU. A store to memory:
 * still no system call, and main -> crunch_loop -> mix as before. */
static volatile struct {
    char marker[32];
    unsigned long rounds;
} progress __attribute__((aligned(64))) = {"qmpprof-linux crunch progress:", 0};

__attribute__((noinline)) static unsigned long mix(unsigned long x) {
    for (int i = 0; i < 1000; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}

__attribute__((noinline)) static void crunch_loop(void) {
    unsigned long x = 1;
    for (;;) {
        sink = x = mix(x);
        progress.rounds++;
    }
}

int main(void) {
    crunch_loop();
}
