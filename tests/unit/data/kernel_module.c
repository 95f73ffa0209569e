/* A Linux kernel module's shape for tests/unit/test_linux_modules.py: built with
 * `gcc -c` (a relocatable object, as a .ko is), with code in .text, a cold function in
 * .text.unlikely (laid out after .text in the module's text) and one in .init.text
 * (freed once loaded, never in that text). */
__attribute__((noinline)) int module_work(int x) { return x * 3 + 1; }

__attribute__((section(".text.unlikely"), noinline)) int module_rare(int x) {
    return module_work(x) - 7;
}

__attribute__((section(".init.text"), noinline)) int module_setup(void) {
    return module_work(2) + module_rare(9);
}
