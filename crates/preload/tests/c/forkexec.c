/* fork and exec behaviour on a private directory. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char path[4096];

int main(int argc, char **argv) {
    const char *dir = argv[1];
    if (argc > 3 && !strcmp(argv[2], "exec-image")) {
        /* After exec: descriptor 50 (no CLOEXEC) survives with its offset, 51 (CLOEXEC) does not. */
        char b[16] = {0};
        int n = read(50, b, 3);
        printf("inherited read %d [%s]\n", n, b);
        printf("cloexec fd: %d errno=%d\n", (int)read(51, b, 1), errno);
        return 0;
    }
    snprintf(path, sizeof path, "%s/shared", dir);
    int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0644);
    write(fd, "abcdef", 6);
    /* 1. A child while the parent holds a private file open: refused. */
    pid_t pid = fork();
    if (pid == 0) {
        int c = open(path, O_RDONLY);
        printf("child with parent busy: %s errno=%d\n", c >= 0 ? "opened" : "refused", c >= 0 ? 0 : errno);
        fflush(stdout);
        _exit(0);
    }
    int status; waitpid(pid, &status, 0);
    close(fd);
    /* 2. The parent has nothing open and waits: the child gets the pool, then the parent sees
     * the child's changes. */
    pid = fork();
    if (pid == 0) {
        int c = open(path, O_WRONLY | O_APPEND);
        printf("child with parent waiting: %s\n", c >= 0 ? "opened" : "refused");
        write(c, "XYZ", 3); close(c);
        fflush(stdout);
        _exit(0);
    }
    waitpid(pid, &status, 0);
    char b[16] = {0};
    fd = open(path, O_RDONLY); read(fd, b, 15); close(fd);
    printf("parent after child: [%s]\n", b);
    /* 3. exec: descriptors without CLOEXEC are handed over. */
    fd = open(path, O_RDONLY);
    lseek(fd, 3, SEEK_SET);
    dup2(fd, 50); close(fd);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    dup3(fd, 51, O_CLOEXEC); close(fd);
    fflush(stdout);
    char *args[] = { argv[0], (char *)dir, "exec-image", "x", NULL };
    execv("/proc/self/exe", args);
    perror("exec");
    return 1;
}
