/* The example guest's process bookkeeping, in miniature: test_os_adapter.py reads the
 * struct layout from this file's DWARF and the initialised data from its .data. */
#include <stdint.h>

struct process {
    uint64_t flags;
    int pid;
    char name[16];
    uint64_t cr3;
};

struct process process_table[4] = {
    {0, 1, "crunch", 0x1000},
    {0, 2, "crunch", 0x2000},
    {0, 3, "[bold]x</text>", 0x3000},
};
struct process *cpu_current[4] = {&process_table[0], 0, &process_table[2], 0};

int main(void) { return cpu_current[0]->pid; }
