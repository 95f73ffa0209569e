/* What qmpprof's adapter registry probes a Linux kernel for, in miniature: the data
 * symbols `linux_banner` and `init_task` (test_adapter_registry.py). */
struct task_struct {
    int pid;
    char comm[16];
};

const char linux_banner[] = "Linux version 6.1.0-probe (qmpprof test)\n";
struct task_struct init_task = {0, "swapper/0"};

int main(void) { return init_task.pid + linux_banner[0]; }
