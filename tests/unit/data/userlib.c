/* A shared library for tests of finding host files for a guest's file mappings
 * (tests/unit/test_user_files.py): one exported function and one static one, which only
 * the full symbol table (kept in the separate debug file once stripped) names, and an
 * inlined one. Built
 * twice with a different VARIANT so the two copies have different build-ids. */
#ifndef VARIANT
#define VARIANT 1
#endif

__attribute__((noinline)) static int userlib_hidden(int value) {
    for (int i = 0; i < 7; i++)
        value = value * 31 + VARIANT + i;
    return value;
}

/* Inlined into userlib_exported: a frame that only the DWARF (in the debug file) shows. */
__attribute__((always_inline)) static inline int userlib_inlined(int value) {
    for (int i = 0; i < 3; i++)
        value = (value << 3) ^ (value >> 2) ^ i;
    return value;
}

int userlib_exported(int value) {
    return userlib_inlined(userlib_hidden(value)) ^ 0x55;
}
