/* A call chain whose frames need different kinds of CFI, for test_cfi_unwind.py.
 * Built several ways (-O2 -fomit-frame-pointer, -O0, with and without
 * -fasynchronous-unwind-tables), run under GDB with a breakpoint on every
 * instruction of these functions; at each stop GDB's frames are the oracle. */
#include <stdint.h>

#define NOINLINE __attribute__((noinline, noclone))

volatile long sink;

NOINLINE long leaf(long x)
{
    long s = 0;
    for (long i = 0; i < 3; i++)
        s += i * x;
    sink = s;
    return s;
}

/* Keeps callee-saved registers live across the call, so they are saved and restored. */
NOINLINE long keeps_registers(long a, long b)
{
    long c = a * 3, d = b * 5, e = a ^ b;
    long r = leaf(a + b);
    sink = c + d + e;
    return r + c + d + e;
}

/* A variable-length array forces a frame pointer even with -fomit-frame-pointer. */
NOINLINE long variable_array(long n)
{
    volatile long buffer[n + 1];
    for (long i = 0; i <= n; i++)
        buffer[i] = i;
    return keeps_registers(buffer[n], n) + buffer[0];
}

/* Over-aligned locals make GCC realign the stack: CFI expressions (DRAP). */
NOINLINE long realigned(long x)
{
    volatile long aligned[4] __attribute__((aligned(64)));
    aligned[0] = x;
    aligned[3] = x + 1;
    return variable_array(aligned[0] & 3) + aligned[3];
}

int main(int argc, char **argv)
{
    (void)argv;
    return (int)(realigned(argc + 4) & 0x7f);
}
