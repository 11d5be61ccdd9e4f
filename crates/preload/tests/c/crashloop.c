/* Endless create / append / rename / unlink / mkdir loop on a directory, to be killed with
 * SIGKILL at a random moment. Every file holds 40-byte lines "<id>:<seq>:xxx…\n" with one id
 * per file and seq counting from 0, so a checker can tell torn or lost appends. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static unsigned long long rng;
static unsigned long nextr(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (unsigned long)rng; }

static char names[4096][300];
static int nnames;

static void scan(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) && nnames < 4000) {
        if (e->d_name[0] == 'f') snprintf(names[nnames++], 300, "%s/%s", dir, e->d_name);
    }
    closedir(d);
}

static void line(char *buf, unsigned long id, unsigned long seq) {
    snprintf(buf, 41, "%010lu:%010lu:xxxxxxxxxxxxxxxxx", id, seq);
    buf[39] = '\n';
}

static void append(const char *path) {
    int fd = open(path, O_RDWR | O_APPEND);
    if (fd < 0) return;
    struct stat st; fstat(fd, &st);
    char first[41] = {0};
    unsigned long id = 0;
    if (st.st_size >= 40 && pread(fd, first, 40, 0) == 40) id = strtoul(first, NULL, 10);
    else { close(fd); return; }
    int n = 1 + nextr() % 20;
    for (int i = 0; i < n; i++) {
        char buf[41]; line(buf, id, st.st_size / 40 + i);
        if (write(fd, buf, 40) != 40) break;
    }
    close(fd);
}

int main(int argc, char **argv) {
    if (argc < 3 || chdir(argv[1])) return 2;
    rng = strtoull(argv[2], NULL, 10) * 2654435761ULL + 1;
    unsigned long id = strtoul(argv[2], NULL, 10) * 1000000UL;
    for (int i = 0; i < 4; i++) { char d[8]; snprintf(d, 8, "d%d", i); mkdir(d, 0755); scan(d); }
    int held[8]; int nheld = 0;
    for (;;) {
        int op = nextr() % 10;
        char p[64], q[64], buf[41];
        snprintf(p, 64, "d%lu/f%lu", nextr() % 4, nextr() % 300);
        switch (op) {
        case 0: case 1: case 2: {
            int fd = open(p, O_CREAT | O_EXCL | O_WRONLY, 0644);
            if (fd >= 0) {
                line(buf, ++id, 0); write(fd, buf, 40); close(fd);
                if (nnames < 4000) strcpy(names[nnames++], p);
            }
            break;
        }
        case 3: case 4: case 5:
            if (nnames) append(names[nextr() % nnames]);
            break;
        case 6:
            snprintf(q, 64, "d%lu/f%lu", nextr() % 4, nextr() % 300);
            rename(p, q);
            break;
        case 7:
            unlink(p);
            break;
        case 8: {
            int fd = open(p, O_RDWR | O_APPEND);
            if (fd >= 0) {
                unlink(p);
                if (nheld == 8) { close(held[0]); memmove(held, held + 1, 7 * sizeof(int)); nheld--; }
                held[nheld++] = fd;
                write(fd, "unlinked-but-open-data-unlinked-but-open\n", 40);
            }
            break;
        }
        case 9:
            snprintf(q, 64, "d%lu/e%lu", nextr() % 4, nextr() % 8);
            if (mkdir(q, 0755) != 0) rmdir(q);
            break;
        }
    }
}
