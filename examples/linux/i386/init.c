/* The i386 Linux guest's init (PID 1): static, 32-bit, no libc (sys32.h).
 *
 * Mounts /proc; says where the kernel put asm_exc_divide_error (from /proc/kallsyms:
 * the oracle for a KASLR slide) as "qmpprof-linux32: kallsyms ADDRESS asm_exc_divide_error";
 * loads /lib/modules/<release>/crc8.ko (mkcpio.py copies it from the cached i386 .deb)
 * and says /proc/modules' lines ("qmpprof-linux32: module crc8 ... 0xADDRESS"); starts
 * the workloads in /bin named by the kernel command line's qmpprof.workloads=a,b (all of
 * crunch, crunchnofp, sysloop, sleeper without it), saying
 * "qmpprof-linux32: started NAME pid N" for each, then "qmpprof-linux32: ready"; then
 * reaps children forever. */
#include "sys32.h"

#define READY_LINE "qmpprof-linux32: ready\n"

static const char *const WORKLOADS[] = {"crunch", "crunchnofp", "sysloop", "sleeper", "sysenter"};

static int starts_with(const char *s, const char *prefix) {
    while (*prefix)
        if (*s++ != *prefix++)
            return 0;
    return 1;
}

static int equal(const char *a, const char *b) {
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}

/* Calls each(line) for each line of the file `path` (lines up to 255 bytes). */
static void each_line(const char *path, void (*each)(char *line)) {
    static char chunk[4096];
    char line[256];
    size_t used = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return;
    for (;;) {
        ssize_t got = read(fd, chunk, sizeof chunk);
        if (got <= 0)
            break;
        for (ssize_t i = 0; i < got; i++) {
            if (chunk[i] == '\n') {
                line[used] = '\0';
                each(line);
                used = 0;
            } else if (used < sizeof line - 1) {
                line[used++] = chunk[i];
            }
        }
    }
    close(fd);
}

static void kallsyms_line(char *line) {
    /* "c1931cc0 T asm_exc_divide_error" */
    size_t n = length(line);
    const char *name = "asm_exc_divide_error";
    size_t k = length(name);
    if (n > k + 1 && line[n - k - 1] == ' ' && equal(line + n - k, name)) {
        say("qmpprof-linux32: kallsyms ");
        line[8] = '\0';
        say(line);
        say(" asm_exc_divide_error\n");
    }
}

static void modules_line(char *line) {
    say("qmpprof-linux32: module ");
    say(line);
    say("\n");
}

static void load_module(void) {
    struct { char sysname[65], nodename[65], release[65], version[65], machine[65], domain[65]; } u;
    char path[160] = "/lib/modules/";
    if (syscall3(NR_uname, &u, 0, 0) != 0)
        return;
    size_t n = length(path);
    for (const char *s = u.release; *s && n < 100; )
        path[n++] = *s++;
    for (const char *s = "/crc8.ko"; *s; )
        path[n++] = *s++;
    path[n] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || syscall3(NR_finit_module, fd, "", 0) != 0) {
        say("init: cannot load ");
        say(path);
        say("\n");
    }
    if (fd >= 0)
        close(fd);
    each_line("/proc/modules", modules_line);
}

static char cmdline[1024];

static void cmdline_line(char *line) {
    size_t n = length(line);
    if (n >= sizeof cmdline)
        n = sizeof cmdline - 1;
    memcpy(cmdline, line, n);
    cmdline[n] = '\0';
}

/* Whether qmpprof.workloads=a,b on the kernel command line names `name` (every
 * workload when there is no such parameter). */
static int wanted(const char *name) {
    const char *key = "qmpprof.workloads=";
    for (const char *at = cmdline; *at; at++) {
        if (!starts_with(at, key))
            continue;
        at += length(key);
        size_t k = length(name);
        while (*at && *at != ' ') {
            size_t token = 0;
            while (at[token] && at[token] != ',' && at[token] != ' ')
                token++;
            if (token == k && starts_with(at, name))
                return 1;
            at += token + (at[token] == ',');
        }
        return 0;
    }
    return 1;
}

static void start(const char *name) {
    char path[64] = "/bin/";
    size_t n = length(path);
    for (const char *s = name; *s; )
        path[n++] = *s++;
    path[n] = '\0';
    int pid = fork();
    if (pid == 0) {
        char *const argv[] = {path, 0};
        char *const envp[] = {0};
        execve(path, argv, envp);
        say("init: cannot run ");
        say(path);
        say("\n");
        exit(127);
    }
    if (pid < 0) {
        say("init: fork failed\n");
        return;
    }
    say("qmpprof-linux32: started ");
    say(name);
    say(" pid ");
    say_number(pid, 10);
    say("\n");
}

int main(void) {
    mount("proc", "/proc", "proc");
    each_line("/proc/kallsyms", kallsyms_line);
    load_module();
    each_line("/proc/cmdline", cmdline_line);
    for (size_t i = 0; i < sizeof WORKLOADS / sizeof WORKLOADS[0]; i++)
        if (wanted(WORKLOADS[i]))
            start(WORKLOADS[i]);
    say(READY_LINE);
    for (;;)
        if (wait4(-1, 0, 0) < 0)
            pause();
}
