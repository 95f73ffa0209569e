/* Starts short-lived processes one after another, as a shell script or a build does:
 * each a dynwork (/bin/dynwork ROUNDS) that runs a few rounds of its loop and exits, so
 * it lives well under a second and most of its samples are in the libraries ld.so
 * mapped after its exec. Waits for each before starting the next.
 *   main -> spawn_one -> fork, execve, waitpid */
#include <sys/wait.h>
#include <unistd.h>

#define ROUNDS "4"

__attribute__((noinline)) static void spawn_one(void) {
    pid_t pid = fork();
    if (pid == 0) {
        char *const argv[] = {"/bin/dynwork", ROUNDS, NULL};
        char *const envp[] = {NULL};
        execve(argv[0], argv, envp);
        _exit(127);
    }
    if (pid > 0)
        waitpid(pid, NULL, 0);
}

int main(void) {
    for (;;)
        spawn_one();
}
