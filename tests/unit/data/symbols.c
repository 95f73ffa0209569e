/* Built by tests/unit/conftest.py into an ELF whose symbols test_symbols.py reads. */
__attribute__((noinline)) int leaf(int x) { return x * 3 + 1; }
__attribute__((noinline)) int middle(int x) { return leaf(x) + leaf(x + 1); }
static __attribute__((noinline)) int helper(int x) { return middle(x) ^ 5; }
int puts(const char *s);
int main(void) { puts("symbols"); return helper(7); }
