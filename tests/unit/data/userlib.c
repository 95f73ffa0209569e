/* A shared library for tests of finding host files for a guest's file mappings
 * (tests/unit/test_user_files.py): one exported function and one static one, which only
 * the full symbol table (kept in the separate debug file once stripped) names. Built
 * twice with a different VARIANT so the two copies have different build-ids. */
#ifndef VARIANT
#define VARIANT 1
#endif

__attribute__((noinline)) static int userlib_hidden(int value) {
    for (int i = 0; i < 7; i++)
        value = value * 31 + VARIANT + i;
    return value;
}

int userlib_exported(int value) {
    return userlib_hidden(value) ^ 0x55;
}
