/* Inlined calls for test_lines.py: source lines and inline chains against addr2line. */
volatile long sink;

static inline __attribute__((always_inline)) long scale(long x)
{
    sink = x;
    return x * 7;
}

static inline __attribute__((always_inline)) long adjust(long x)
{
    long y = scale(x + 1);
    sink = y;
    return y - 3;
}

__attribute__((noinline)) long outer(long x)
{
    long total = 0;
    for (long i = 0; i < x; i++)
        total += adjust(i);
    return total;
}

int main(int argc, char **argv)
{
    (void)argv;
    return (int)outer(argc + 3);
}
