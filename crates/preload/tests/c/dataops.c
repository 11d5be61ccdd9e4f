/* Data operations on an open private file between two marker system calls; the test
 * checks with strace that nothing in between entered the kernel. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

int main(int argc, char **argv) {
    char path[4096];
    snprintf(path, sizeof path, "%s/data", argv[1]);
    int fd = open(path, O_CREAT | O_RDWR, 0644);
    if (fd < 0) { perror("open"); return 1; }
    FILE *f = fopen(argv[2], "r"); /* warms up stdio before the marker */
    if (f) fclose(f);
    char buf[8192]; memset(buf, 'a', sizeof buf);
    access("/kaiso-marker-begin", F_OK);
    long total = 0;
    for (int i = 0; i < 1000; i++) {
        total += write(fd, buf, sizeof buf);
        total += pwrite(fd, buf, 100, i * 37);
        total += pread(fd, buf, 4096, i * 4096 / 3);
        struct stat st; fstat(fd, &st); total += st.st_size > 0;
        lseek(fd, 0, SEEK_END);
        struct iovec v[2] = { { buf, 10 }, { buf + 10, 20 } };
        total += writev(fd, v, 2);
        fdatasync(fd);
    }
    lseek(fd, 0, SEEK_SET);
    while (read(fd, buf, sizeof buf) > 0) total++;
    FILE *s = fdopen(dup(fd), "r+");
    fseek(s, 0, SEEK_SET);
    fprintf(s, "hello %ld\n", total);
    fflush(s);
    fgets(buf, sizeof buf, s);
    fclose(s);
    access("/kaiso-marker-end", F_OK);
    close(fd);
    printf("total %ld\n", total);
    return 0;
}
