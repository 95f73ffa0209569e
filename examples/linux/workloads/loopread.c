/* Keeps a kernel thread busy: reads /dev/loop0 with O_DIRECT, so each read bypasses the
 * loop device's page cache and the loop driver's kworker copies the data from the
 * backing file (in the initramfs's tmpfs) while this task waits for it.
 *   main -> setup_loop (once: loads loop.ko, says where its sections are, binds
 *   /dev/loop0 to BACKING)
 *   main -> read_loop -> read_block -> pread
 * Runs only when qmpprof.workloads= names it (init.c), and stops itself once set up
 * (init lets it go on). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>
#include <unistd.h>

#define BACKING "/loopread.img"
#define DEVICE "/dev/loop0"
#define BACKING_SIZE (4 << 20)
#define BLOCK (64 << 10)

static void fail(const char *what) {
    dprintf(2, "loopread: %s failed\n", what);
    exit(1);
}

/* Says where the kernel put each section of the loop module, "qmpprof-linux: section
 * loop <name> <address>" (from /sys/module/loop/sections): the tests load loop.ko's
 * debug file into GDB there. */
static void say_sections(void) {
    char path[320], address[32];
    mkdir("/sys", 0555);
    if (mount("sysfs", "/sys", "sysfs", 0, NULL) != 0 && errno != EBUSY)
        fail("mounting /sys");
    DIR *sections = opendir("/sys/module/loop/sections");
    if (sections == NULL)
        fail("opening /sys/module/loop/sections");
    for (struct dirent *section; (section = readdir(sections)) != NULL;) {
        if (section->d_name[0] != '.' || strcmp(section->d_name, ".") == 0 ||
            strcmp(section->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof path, "/sys/module/loop/sections/%s", section->d_name);
        FILE *file = fopen(path, "r");
        if (file != NULL && fscanf(file, "%31s", address) == 1)
            dprintf(1, "qmpprof-linux: section loop %s %s\n", section->d_name, address);
        if (file != NULL)
            fclose(file);
    }
    closedir(sections);
}

/* /lib/modules/<release>/loop.ko (mkcpio.py put it there); already loaded is fine. */
static void load_loop_module(void) {
    char path[128];
    struct utsname system;
    if (uname(&system) != 0)
        fail("uname");
    snprintf(path, sizeof path, "/lib/modules/%s/loop.ko", system.release);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        fail("opening loop.ko");
    if (syscall(SYS_finit_module, fd, "", 0) != 0 && errno != EEXIST)
        fail("loading loop.ko");
    close(fd);
    say_sections();
}

__attribute__((noinline)) static int setup_loop(void) {
    static char block[BLOCK];
    load_loop_module();
    int backing = open(BACKING, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (backing < 0)
        fail("creating " BACKING);
    memset(block, 0x5a, sizeof block);
    for (int written = 0; written < BACKING_SIZE; written += BLOCK)
        if (write(backing, block, BLOCK) != BLOCK)
            fail("writing " BACKING);
    if (mknod(DEVICE, S_IFBLK | 0600, makedev(7, 0)) != 0 && access(DEVICE, F_OK) != 0)
        fail("mknod " DEVICE);
    int control = open(DEVICE, O_RDWR | O_CLOEXEC);
    if (control < 0 || ioctl(control, LOOP_SET_FD, backing) != 0)
        fail("LOOP_SET_FD");
    close(backing);
    int device = open(DEVICE, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (device < 0)
        fail("opening " DEVICE " with O_DIRECT");
    return device;
}

__attribute__((noinline)) static void read_block(int device, void *buffer, off_t at) {
    if (pread(device, buffer, BLOCK, at) != BLOCK)
        fail("pread");
}

__attribute__((noinline)) static void read_loop(int device, void *buffer) {
    for (off_t at = 0; at < BACKING_SIZE; at += BLOCK)
        read_block(device, buffer, at);
}

int main(void) {
    void *buffer;
    int device = setup_loop();
    /* init (given stops_in_main) waits for this stop before it says it is ready, so the
     * sections are on the console by then. */
    const char *stop = getenv("QMPPROF_STOP_IN_MAIN");
    if (stop != NULL && strcmp(stop, "1") == 0)
        raise(SIGSTOP);
    if (posix_memalign(&buffer, 4096, BLOCK) != 0)
        fail("posix_memalign");
    for (;;)
        read_loop(device, buffer);
}
