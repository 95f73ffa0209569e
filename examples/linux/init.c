/* The Linux example guest's init (PID 1), static, in the initramfs.
 *
 * Says on the console where the kernel put its divide-error handler (the tests'
 * oracle for qmpprof's KASLR slide, from /proc/kallsyms), starts the workloads (saying
 * each one's /proc/PID/maps), says it is ready, then reaps children forever (PID 1 must not exit).
 *
 * Each workload but dynwork is its own static non-PIE program in /bin (workloads/NAME.c,
 * built by the Makefile), so `qmpprof --user build/NAME` and GDB's add-symbol-file find
 * its code at its link address, and its comm is its file name (exec takes it from the path):
 *   crunch      CPU-bound, frame pointers:       main -> crunch_loop -> mix
 *   crunchnofp  the same, -O2 -fomit-frame-pointer (only CFI unwinds it)
 *   sysloop     system calls: main -> sysloop_loop -> ask_parent -> getppid,
 *               -> read_zero -> read (/dev/zero), -> write_null -> write (/dev/null)
 *   pinned      two threads pinned to CPUs 0 and 1:  main -> spin -> churn,
 *               start_thread -> second_thread -> spin -> churn
 *   sleeper     mostly asleep: main -> doze -> nanosleep (20 ms)
 *   dynwork     a dynamically linked PIE (Debian's ld.so and libc, our libqmpwork.so.1)
 *               at addresses ASLR picks: main -> dyn_loop -> dyn_sort -> qsort ->
 *               compare_keys, ... (workloads/dynwork.c); only when --workloads names it
 *   loopread    keeps the loop driver's kworker busy: O_DIRECT reads of /dev/loop0 over
 *               a file in tmpfs (workloads/loopread.c); only when --workloads names it
 *   timeloop    reads the clock, in the vDSO: main -> time_loop -> read_clock ->
 *               clock_gettime -> the vDSO's; only when --workloads names it
 *   spawner     starts short-lived dynworks (a few rounds of its loop) one after
 *               another: main -> spawn_one -> fork, execve; only when --workloads names it
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#define READY_LINE "qmpprof-linux: ready\n"

/* Each workload: whether it runs only when qmpprof.workloads= names it (dynwork: the
 * other tests' oracles know only the static programs), and whether it stops itself
 * (SIGSTOP) in main when STOP_IN_MAIN_ENV is in its environment (a dynamically linked
 * one first thing: ld.so maps its libraries after the exec, see say_maps; loopread once
 * it has loaded loop.ko and said where its sections are). */
static const struct workload {
    const char *name;
    int on_request_only, stops_in_main;
} WORKLOADS[] = {
    {"crunch", 0, 0}, {"crunchnofp", 0, 0}, {"sysloop", 0, 0},
    {"pinned", 0, 0}, {"sleeper", 0, 0},    {"dynwork", 1, 1},
    {"loopread", 1, 1}, {"timeloop", 1, 0}, {"spawner", 1, 0},
};
#define STOP_IN_MAIN_ENV "QMPPROF_STOP_IN_MAIN=1"

/* Says each line of /proc/PID/maps as "qmpprof-linux: maps PID LINE": the tests' oracle
 * for the memory map qmpprof reads from the kernel's VMAs. */
static void print_maps(pid_t pid) {
    char name[64], line[512];
    snprintf(name, sizeof name, "/proc/%d/maps", (int)pid);
    FILE *maps = fopen(name, "r");
    if (maps == NULL)
        return;
    while (fgets(line, sizeof line, maps) != NULL)
        dprintf(1, "qmpprof-linux: maps %d %s", (int)pid, line);
    fclose(maps);
}

/* Says `pid`'s maps once its program is loaded. The child asked to be traced, so its exec
 * stops it (SIGTRAP) after the kernel mapped the program and before it runs: a static
 * program's map is complete there. (Waiting until /proc/PID/exe names the program is not
 * enough: the kernel sets it before it maps the program, and a map read then held only
 * [stack].) A dynamically linked one (`stops_in_main`) is let go and stops itself in
 * main, once ld.so has mapped its libraries; its map is read then and it continues. */
static void say_maps(pid_t pid, int stops_in_main) {
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFSTOPPED(status))
        return;  /* the exec failed: the child exited */
    if (!stops_in_main)
        print_maps(pid);
    ptrace(PTRACE_DETACH, pid, NULL, NULL);
    if (!stops_in_main)
        return;
    if (waitpid(pid, &status, WUNTRACED) != pid || !WIFSTOPPED(status))
        return;
    print_maps(pid);
    kill(pid, SIGCONT);
}

static void start(const struct workload *workload) {
    const char *name = workload->name;
    char path[64];
    snprintf(path, sizeof path, "/bin/%s", name);
    pid_t pid = fork();
    if (pid == 0) {
        char *const argv[] = {path, NULL};
        char *const envp[] = {workload->stops_in_main ? STOP_IN_MAIN_ENV : NULL, NULL};
        if (ptrace(PTRACE_TRACEME, 0, NULL, NULL) != 0)
            dprintf(2, "init: cannot trace %s\n", path);
        execve(path, argv, envp);
        dprintf(2, "init: cannot run %s\n", path);
        _exit(127);
    }
    if (pid < 0) {
        dprintf(2, "init: fork for %s failed\n", name);
        return;
    }
    dprintf(1, "qmpprof-linux: started %s pid %d\n", name, (int)pid);
    say_maps(pid, workload->stops_in_main);
}

static void say(const char *text) {
    if (write(1, text, strlen(text)) < 0)
        return;
}

/* "<address> T asm_exc_divide_error" from /proc/kallsyms, as "qmpprof-linux: kallsyms
 * <address> asm_exc_divide_error". Nothing if /proc or the symbol is missing. */
static void say_divide_error_handler(void) {
    char line[256];
    if (mount("proc", "/proc", "proc", 0, NULL) != 0)
        return;
    FILE *kallsyms = fopen("/proc/kallsyms", "r");
    if (kallsyms == NULL)
        return;
    while (fgets(line, sizeof line, kallsyms) != NULL) {
        char address[32], type[4], name[128];
        if (sscanf(line, "%31s %3s %127s", address, type, name) == 3 &&
            strcmp(name, "asm_exc_divide_error") == 0) {
            dprintf(1, "qmpprof-linux: kallsyms %s %s\n", address, name);
            break;
        }
    }
    fclose(kallsyms);
}

/* Loads /lib/modules/<release>/crc8.ko (mkcpio.py put it there) and says where
 * /proc/modules puts each module, "qmpprof-linux: module crc8 at 0x<address>", and
 * where /proc/kallsyms puts crc8's symbols, "qmpprof-linux: ksym <address> <type>
 * <name>": the tests' oracles for qmpprof's module list and --module-dir. Needs /proc
 * (say_divide_error_handler mounts it). */
static void load_module(void) {
    char path[128], line[256], name[64], address[32], type[4];
    struct utsname system;
    if (uname(&system) != 0)
        return;
    snprintf(path, sizeof path, "/lib/modules/%s/crc8.ko", system.release);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || syscall(SYS_finit_module, fd, "", 0) != 0)
        dprintf(2, "init: cannot load %s\n", path);
    if (fd >= 0)
        close(fd);
    FILE *modules = fopen("/proc/modules", "r");
    if (modules == NULL)
        return;
    while (fgets(line, sizeof line, modules) != NULL)
        if (sscanf(line, "%63s %*s %*s %*s %*s %31s", name, address) == 2)
            dprintf(1, "qmpprof-linux: module %s at %s\n", name, address);
    fclose(modules);
    FILE *kallsyms = fopen("/proc/kallsyms", "r");
    if (kallsyms == NULL)
        return;
    while (fgets(line, sizeof line, kallsyms) != NULL)
        if (strstr(line, "\t[crc8]") != NULL &&
            sscanf(line, "%31s %3s %63s", address, type, name) == 3)
            dprintf(1, "qmpprof-linux: ksym %s %s %s\n", address, type, name);
    fclose(kallsyms);
}

/* Whether the kernel command line's qmpprof.workloads=a,b,c (boot.sh --workloads) names
 * the workload; with no such parameter every workload runs but those on request only.
 * Fewer workloads leave the CPUs idle time, which tests of idle and kernel-thread samples
 * need. */
static int wanted(const struct workload *workload) {
    const char *name = workload->name;
    char cmdline[1024] = "";
    FILE *file = fopen("/proc/cmdline", "r");
    if (file != NULL) {
        if (fgets(cmdline, sizeof cmdline, file) == NULL)
            cmdline[0] = '\0';
        fclose(file);
    }
    const char *list = strstr(cmdline, "qmpprof.workloads=");
    if (list == NULL)
        return !workload->on_request_only;
    list += strlen("qmpprof.workloads=");
    size_t length = strlen(name);
    for (const char *at = list; *at != '\0' && *at != ' ' && *at != '\n';) {
        size_t token = strcspn(at, ", \n");
        if (token == length && strncmp(at, name, length) == 0)
            return 1;
        at += token + (at[token] == ',');
        if (token == 0)
            break;
    }
    return 0;
}

int main(void) {
    say_divide_error_handler();
    load_module();
    for (size_t i = 0; i < sizeof WORKLOADS / sizeof WORKLOADS[0]; i++)
        if (wanted(&WORKLOADS[i]))
            start(&WORKLOADS[i]);
    say(READY_LINE);
    for (;;)
        if (wait(NULL) < 0)
            pause();
}
