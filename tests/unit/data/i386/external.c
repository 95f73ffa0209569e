/* The function plt_calls.c calls, in a 32-bit shared library of its own: linked against
 * it, plt_calls.c becomes an executable whose PLT jumps through absolute GOT slots
 * (test_plt.py). Built `gcc -m32 -ffreestanding -nostdlib -shared -fPIC`. */
int external(int x)
{
    return x * 3;
}
