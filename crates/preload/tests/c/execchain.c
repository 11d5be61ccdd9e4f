/* Every exec entry point and posix_spawn on a private directory: a chain of stages, each
 * started by a different exec form, each reading the next two bytes of a private file through
 * an inherited descriptor (40, no CLOEXEC) and reporting whether the library's settings
 * survived an environment the program built without them. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
static char *bare_env[] = {"X=own-env", "PATH=/usr/bin:/bin", NULL};

static void report(const char *stage) {
    char b[3] = {0};
    int n = read(40, b, 2);
    const char *pre = getenv("LD_PRELOAD");
    printf("stage %s: read %d [%s] preload=%s pool=%s X=%s\n", stage, n, b,
           pre && strstr(pre, "kaiso_preload") ? "yes" : "no", getenv("KAISO_POOL") ? "yes" : "no",
           getenv("X") ? getenv("X") : "-");
    fflush(stdout);
}

int main(int argc, char **argv) {
    const char *dir = argv[1];
    int stage = atoi(argv[2]);
    const char *orig = argv[3];
    char path[4096], next[16];
    snprintf(next, sizeof next, "%d", stage + 1);
    if (stage > 0) report(argv[2]);
    char *args[] = {(char *)orig, (char *)dir, next, (char *)orig, NULL};
    switch (stage) {
    case 0: {
        snprintf(path, sizeof path, "%s/in", dir);
        int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0644);
        write(fd, "abcdefghijklmnopqrstuvwxyz", 26);
        lseek(fd, 0, SEEK_SET);
        dup2(fd, 40);
        close(fd);
        execl(orig, orig, dir, next, orig, (char *)NULL);
        break;
    }
    case 1: {
        char copy[4096];
        snprintf(copy, sizeof copy, "%s", orig);
        char *d = dirname(copy);
        char p[8192];
        snprintf(p, sizeof p, "%s:/usr/bin:/bin", d);
        setenv("PATH", p, 1);
        snprintf(copy, sizeof copy, "%s", orig);
        execlp(basename(copy), orig, dir, next, orig, (char *)NULL);
        break;
    }
    case 2:
        execle(orig, orig, dir, next, orig, (char *)NULL, bare_env);
        break;
    case 3:
        execvpe(orig, args, bare_env);
        break;
    case 4: {
        int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
        fexecve(fd, args, bare_env);
        break;
    }
    case 5: {
        /* The program itself becomes a private file and runs from there. */
        int in = open("/proc/self/exe", O_RDONLY);
        snprintf(path, sizeof path, "%s/prog", dir);
        int out = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0755);
        char buf[65536];
        ssize_t n;
        while ((n = read(in, buf, sizeof buf)) > 0) write(out, buf, n);
        close(in);
        close(out);
        args[0] = path;
        execv(path, args);
        break;
    }
    case 6: {
        /* A private shell script, which runs the original program again. */
        snprintf(path, sizeof path, "%s/script.sh", dir);
        FILE *f = fopen(path, "w");
        fprintf(f, "#!/bin/sh\necho \"script ran with $# arguments\"\nexec \"$3\" \"$1\" 8 \"$3\"\n");
        fclose(f);
        chmod(path, 0755);
        args[0] = path;
        execv(path, args);
        break;
    }
    case 8: {
        /* posix_spawn: the child's stdout is a private file (adddup2), its own environment
         * lacks the settings; then the parent gives the pool up while it waits. */
        snprintf(path, sizeof path, "%s/out", dir);
        int out = open(path, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, out, 1);
        pid_t pid;
        int r = posix_spawn(&pid, orig, &fa, NULL, args, bare_env);
        posix_spawn_file_actions_destroy(&fa);
        close(out);
        close(40);
        if (r != 0) { printf("posix_spawn failed: %s\n", strerror(r)); return 1; }
        int st;
        waitpid(pid, &st, 0);
        char b[512] = {0};
        int in = open(path, O_RDONLY);
        read(in, b, sizeof b - 1);
        close(in);
        printf("spawned child wrote to the private file: %s", b);
        printf("spawned child exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        /* What the child's kernel cannot do is refused, not silently done wrong. */
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 5, path, O_RDONLY, 0);
        char *a2[] = {"true", NULL};
        r = posix_spawnp(&pid, "true", &fa, NULL, a2, environ);
        posix_spawn_file_actions_destroy(&fa);
        printf("addopen of a private path: %s\n", r == 0 ? "started" : strerror(r));
        if (r == 0) waitpid(pid, &st, 0);
        return 0;
    }
    case 9:
        printf("stage 9 runs with stdout on the private file\n");
        return 0;
    }
    printf("stage %d: exec failed: %s\n", stage, strerror(errno));
    return 1;
}
