/* A program that calls libc through its PLT (tests/unit/test_plt.py): each stub gets
 * a name, `qsort@plt`, as objdump gives it. -fno-builtin keeps the calls real calls. */
#include <stdlib.h>
#include <string.h>

static int compare(const void *a, const void *b) {
    return *(const int *)a - *(const int *)b;
}

int main(int argc, char **argv) {
    int values[4] = {argc, 3, 1, 2};
    qsort(values, 4, sizeof values[0], compare);
    const char *home = getenv("HOME");
    return (int)strlen(argv[0]) + values[0] + (home != NULL);
}
