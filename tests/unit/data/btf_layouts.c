/* Structs whose layouts qmpprof reads from BTF (pahole -J puts it in this program) and
 * from DWARF, checked against what the compiler itself says: run, the program prints
 * one line per member, "struct member offset size", from offsetof and sizeof. The
 * shapes are the kernel's: members of anonymous unions and structs nested two deep
 * (6.12's pcpu_hot), bitfields before other members (task_struct), typedefs and
 * qualifiers over a member's type, arrays of bytes and of words, pointers. */
#include <stddef.h>
#include <stdio.h>

typedef unsigned int pid_type;
typedef const volatile pid_type quiet_pid;
struct list { struct list *next, *prev; };
enum state { RUNNING, SLEEPING };

struct task {
    unsigned int flags : 3;
    unsigned int in_iowait : 1;
    unsigned long long stamp;
    pid_type pid;
    quiet_pid tgid;
    char comm[16];
    long words[5];
    struct list tasks;
    enum state state;
    struct task *parent;
};

struct hot {
    union {
        struct {
            struct task *current_task;
            int preempt_count;
            union {
                unsigned long top_of_stack;
                unsigned long stack_end;
            };
        };
        unsigned char pad[64];
    };
    int after;
};

#define MEMBER(type, name) \
    printf("%s %s %zu %zu\n", #type, #name, offsetof(struct type, name), \
           sizeof(((struct type *)0)->name))

int main(void) {
    MEMBER(task, stamp);
    MEMBER(task, pid);
    MEMBER(task, tgid);
    MEMBER(task, comm);
    MEMBER(task, words);
    MEMBER(task, tasks);
    MEMBER(task, state);
    MEMBER(task, parent);
    MEMBER(list, next);
    MEMBER(list, prev);
    MEMBER(hot, current_task);
    MEMBER(hot, preempt_count);
    MEMBER(hot, top_of_stack);
    MEMBER(hot, stack_end);
    MEMBER(hot, pad);
    MEMBER(hot, after);
    return 0;
}
