/* A 32-bit shared library that calls a function it does not define: the linker gives
 * it a PLT, and the PLT CFI whose CFA is an expression over esp and eip (i386's
 * DW_OP_breg4 and DW_OP_breg8), for test_unwind_i386.py. Built
 * `gcc -m32 -ffreestanding -nostdlib -shared -fPIC`: no C library is needed. */
extern int external(int);

int calls_out(int x)
{
    return external(x) + 1;
}
