/* File-system behaviour transcript. Run once in a normal directory and once in a private
 * one; the transcripts must be identical. Descriptor numbers and absolute paths are never
 * printed, only results and errno values. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#define R(name, expr) do { errno = 0; long r_ = (long)(expr); \
    printf("%-28s %ld errno=%d\n", name, r_ < 0 ? -1L : r_, r_ < 0 ? errno : 0); } while (0)
#define OK(name, expr) do { errno = 0; long r_ = (long)(expr); \
    printf("%-28s %s errno=%d\n", name, r_ >= 0 ? "ok" : "fail", r_ < 0 ? errno : 0); } while (0)

static int cmp(const void *a, const void *b) { return strcmp(*(char **)a, *(char **)b); }

static void list(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) { printf("opendir %s failed errno=%d\n", dir, errno); return; }
    char *names[256]; int n = 0; int dots = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) { dots++; continue; }
        names[n++] = strdup(e->d_name);
    }
    qsort(names, n, sizeof *names, cmp);
    printf("list %s dots=%d:", dir, dots);
    for (int i = 0; i < n; i++) { printf(" %s", names[i]); free(names[i]); }
    printf("\n");
    closedir(d);
}

static long sum(const char *p, long n) { long s = 0; for (long i = 0; i < n; i++) s = s * 31 + (unsigned char)p[i]; return s; }

int main(int argc, char **argv) {
    if (argc < 2 || chdir(argv[1]) != 0) { perror("chdir"); return 2; }
    /* From here on, all paths are relative to the base directory given as argv[1]; the
     * private run passes the private directory, so relative resolution is exercised too. */
    char buf[65536];
    struct stat st;

    /* stdio */
    FILE *f = fopen("s.txt", "w");
    for (int i = 0; i < 100; i++) fprintf(f, "line %d\n", i);
    R("fclose w", fclose(f));
    f = fopen("s.txt", "a"); fputs("tail\n", f); R("fclose a", fclose(f));
    f = fopen("s.txt", "r");
    int lines = 0; while (fgets(buf, sizeof buf, f)) lines++;
    R("stdio lines", lines);
    R("fseek", fseek(f, 10, SEEK_SET));
    R("fread", fread(buf, 1, 20, f)); buf[20] = 0; printf("fread text [%s]\n", buf);
    R("ftell", ftell(f));
    R("fileno>=0", fileno(f) >= 0);
    fclose(f);
    f = fopen("s.txt", "r+"); fseek(f, 5, SEEK_SET); fputs("XX", f); fclose(f);
    R("stat s.txt size", stat("s.txt", &st) == 0 ? st.st_size : -1);
    f = fopen("s.txt", "r"); R("fread all", fread(buf, 1, sizeof buf, f)); fclose(f);
    printf("s.txt head [%.12s]\n", buf);
    R("fopen missing", fopen("nope/x", "r") ? 0 : -1);
    f = fopen("s.txt", "wx"); R("fopen wx exists", f ? 0 : -1); if (f) fclose(f);

    /* readdir after create / unlink / rename */
    R("mkdir d", mkdir("d", 0755));
    for (const char *n = "abc"; *n; n++) { char p[8] = {'d', '/', *n, 0}; close(open(p, O_CREAT | O_WRONLY, 0644)); }
    list("d");
    R("unlink d/b", unlink("d/b"));
    list("d");
    R("rename d/c d/e", rename("d/c", "d/e"));
    list("d");

    /* unlink while open */
    int fd = open("u", O_CREAT | O_RDWR, 0644);
    memset(buf, 'u', 5000);
    R("write u", write(fd, buf, 5000));
    R("unlink u", unlink("u"));
    R("fstat nlink", fstat(fd, &st) == 0 ? (long)st.st_nlink : -1);
    R("pread after unlink", pread(fd, buf, 10, 4000));
    R("write after unlink", write(fd, buf, 100));
    R("fstat size", fstat(fd, &st) == 0 ? st.st_size : -1);
    R("close u", close(fd));
    R("stat u", stat("u", &st));
    list(".");

    /* O_APPEND */
    fd = open("ap", O_CREAT | O_WRONLY | O_APPEND, 0644);
    R("append a", write(fd, "a", 1));
    R("lseek 0", lseek(fd, 0, SEEK_SET));
    R("append b", write(fd, "b", 1));
    R("pwrite append c", pwrite(fd, "c", 1, 0));
    close(fd);
    fd = open("ap", O_RDONLY); R("read ap", read(fd, buf, 100)); printf("ap [%.3s]\n", buf); close(fd);

    /* sparse writes, truncate */
    fd = open("sp", O_CREAT | O_RDWR, 0644);
    R("pwrite far", pwrite(fd, "x", 1, 1000000));
    R("size sparse", fstat(fd, &st) == 0 ? st.st_size : -1);
    memset(buf, 7, 100);
    R("pread hole", pread(fd, buf, 100, 500000)); R("hole sum", sum(buf, 100));
    R("pwrite head", pwrite(fd, "hello world", 11, 0));
    R("ftruncate 5", ftruncate(fd, 5));
    R("ftruncate 20000", ftruncate(fd, 20000));
    memset(buf, 7, 20000);
    R("pread regrown", pread(fd, buf, 20000, 0)); R("regrown sum", sum(buf, 20000));
    R("lseek end", lseek(fd, 0, SEEK_END));
    R("lseek -1", lseek(fd, -30000, SEEK_CUR));
    close(fd);

    /* rename over an existing file, directory rules */
    fd = open("r1", O_CREAT | O_WRONLY, 0644); write(fd, "one", 3); close(fd);
    fd = open("r2", O_CREAT | O_WRONLY, 0644); write(fd, "two!", 4); close(fd);
    R("rename r1 r2", rename("r1", "r2"));
    fd = open("r2", O_RDONLY); R("read r2", read(fd, buf, 10)); printf("r2 [%.3s]\n", buf); close(fd);
    R("stat r1", stat("r1", &st));
    R("mkdir e", mkdir("e", 0755));
    R("rename e d (nonempty)", rename("e", "d"));
    R("rename e r2 (file)", rename("e", "r2"));
    R("rename r2 e (dir)", rename("r2", "e"));
    R("rename d d/e/x (into self)", rename("d", "d/x"));
    R("rename e f", rename("e", "f"));
    R("rmdir f", rmdir("f"));

    /* fsync */
    fd = open("fs", O_CREAT | O_WRONLY, 0644); write(fd, "data", 4);
    R("fsync", fsync(fd)); R("fdatasync", fdatasync(fd)); close(fd);
    fd = open(".", O_RDONLY | O_DIRECTORY); R("fsync dir", fsync(fd)); close(fd);

    /* dup shares the offset */
    fd = open("dup", O_CREAT | O_RDWR | O_TRUNC, 0644);
    int fd2 = dup(fd);
    R("write via dup", write(fd2, "12345", 5));
    R("offset via orig", lseek(fd, 0, SEEK_CUR));
    R("dup2 to 100", dup2(fd, 100));
    R("write via 100", write(100, "678", 3));
    R("close 100", close(100));
    R("close again", close(100));
    close(fd2); close(fd);
    R("stat dup size", stat("dup", &st) == 0 ? st.st_size : -1);

    /* error codes */
    R("open missing", open("missing", O_RDONLY));
    R("open excl", open("dup", O_CREAT | O_EXCL | O_WRONLY, 0644));
    R("mkdir existing", mkdir("d", 0755));
    R("rmdir nonempty", rmdir("d"));
    R("unlink dir", unlink("d"));
    R("rmdir file", rmdir("dup"));
    R("open dir wr", open("d", O_WRONLY));
    R("open file/x", open("dup/x", O_RDONLY));
    R("opendir file", opendir("dup") ? 0 : -1);
    R("open O_DIRECTORY file", open("dup", O_RDONLY | O_DIRECTORY));
    R("read on dir", (fd = open("d", O_RDONLY), read(fd, buf, 1))); close(fd);

    /* symlinks */
    R("symlink", symlink("dup", "ln"));
    ssize_t n = readlink("ln", buf, sizeof buf); R("readlink", n); printf("link [%.*s]\n", (int)n, buf);
    R("stat via link", stat("ln", &st) == 0 ? st.st_size : -1);
    R("lstat is link", lstat("ln", &st) == 0 ? S_ISLNK(st.st_mode) : -1);
    R("readlink non-link", readlink("dup", buf, sizeof buf));
    R("symlink exists", symlink("x", "ln"));

    /* current directory */
    R("chdir d", chdir("d"));
    OK("create relative", (fd = open("rel", O_CREAT | O_WRONLY, 0644))); close(fd);
    char *cwd = getcwd(buf, sizeof buf);
    printf("cwd ends with /d: %d\n", cwd && strlen(cwd) > 2 && !strcmp(cwd + strlen(cwd) - 2, "/d"));
    list(".");
    R("chdir ..", chdir(".."));
    R("stat d/rel", stat("d/rel", &st));
    R("access F_OK", access("d/rel", F_OK));
    R("access missing", access("d/zz", F_OK));

    /* fcntl and locks */
    fd = open("lk", O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    R("F_GETFL acc", fcntl(fd, F_GETFL) & O_ACCMODE);
    R("F_GETFD", fcntl(fd, F_GETFD));
    R("F_SETFL append", fcntl(fd, F_SETFL, O_APPEND));
    R("F_GETFL append", (fcntl(fd, F_GETFL) & O_APPEND) != 0);
    struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 10 };
    R("F_SETLK", fcntl(fd, F_SETLK, &fl));
    fl.l_type = F_WRLCK; R("F_GETLK", fcntl(fd, F_GETLK, &fl)); R("F_GETLK type", fl.l_type);
    int fd3 = open("lk", O_RDWR);
    R("flock ex", flock(fd, LOCK_EX));
    R("flock other nb", flock(fd3, LOCK_EX | LOCK_NB));
    R("flock un", flock(fd, LOCK_UN));
    R("flock other now", flock(fd3, LOCK_EX | LOCK_NB));
    struct flock o = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0 };
    R("OFD lock", fcntl(fd, F_OFD_SETLK, &o));
    R("OFD lock other", fcntl(fd3, F_OFD_SETLK, &o));
    close(fd3); close(fd);

    /* readv / writev */
    fd = open("vec", O_CREAT | O_RDWR | O_TRUNC, 0644);
    struct iovec iv[2] = { { "abc", 3 }, { "defg", 4 } };
    R("writev", writev(fd, iv, 2));
    char a[2], b[10]; struct iovec rv[2] = { { a, 2 }, { b, 10 } };
    R("preadv", preadv(fd, rv, 2, 0)); printf("vec [%.2s|%.5s]\n", a, b);
    close(fd);

    /* metadata */
    R("truncate path", truncate("vec", 2));
    R("size after truncate", stat("vec", &st) == 0 ? st.st_size : -1);
    R("chmod 600", chmod("vec", 0600));
    R("mode", stat("vec", &st) == 0 ? (long)(st.st_mode & 07777) : -1);
    struct timespec ts[2] = { { 1000000000, 0 }, { 1234567890, 500 } };
    R("utimensat", utimensat(AT_FDCWD, "vec", ts, 0));
    R("mtime", stat("vec", &st) == 0 ? st.st_mtim.tv_sec : -1);
    struct statvfs sv; R("statvfs", statvfs(".", &sv));
    R("is dir", stat("d", &st) == 0 ? S_ISDIR(st.st_mode) : -1);
    R("dir nlink", stat(".", &st) == 0 ? (long)st.st_nlink : -1);

    /* a large file */
    fd = open("big", O_CREAT | O_RDWR | O_TRUNC, 0644);
    long s1 = 0;
    for (int i = 0; i < 48; i++) { for (int j = 0; j < 65536; j++) buf[j] = (char)(i * 7 + j); s1 += sum(buf, 65536); write(fd, buf, 65536); }
    lseek(fd, 0, SEEK_SET);
    long s2 = 0; ssize_t k; while ((k = read(fd, buf, 65536)) > 0) s2 += sum(buf, k);
    R("big checksum equal", s1 == s2);
    close(fd);

    /* hard links */
    fd = open("hl", O_CREAT | O_RDWR | O_TRUNC, 0644);
    write(fd, "linked", 6);
    R("link", link("hl", "hl2"));
    R("nlink after link", fstat(fd, &st) == 0 ? (long)st.st_nlink : -1);
    R("link exists", link("hl", "hl2"));
    R("link dir", link("d", "dl"));
    R("link missing", link("nothere", "x2"));
    R("linkat", linkat(AT_FDCWD, "hl", AT_FDCWD, "hl3", 0));
    struct stat st2;
    R("same inode", stat("hl2", &st) == 0 && stat("hl", &st2) == 0 && st.st_ino == st2.st_ino);
    R("write via link", pwrite(fd, "LINKED", 6, 0));
    fd2 = open("hl3", O_RDONLY);
    memset(buf, 0, 16);
    R("read via other name", read(fd2, buf, 16)); printf("hl3 [%s]\n", buf);
    close(fd2);
    R("unlink first name", unlink("hl"));
    R("nlink after unlink", stat("hl2", &st) == 0 ? (long)st.st_nlink : -1);
    R("rename onto own link", rename("hl2", "hl3"));
    R("both names remain", access("hl2", F_OK) == 0 && access("hl3", F_OK) == 0);
    R("unlink hl2", unlink("hl2"));
    R("unlink hl3", unlink("hl3"));
    R("fstat nlink 0", fstat(fd, &st) == 0 ? (long)st.st_nlink : -1);
    close(fd);

    /* mmap: MAP_PRIVATE reads and private writes; MAP_SHARED of a private file is refused
     * (checked by the caller: ENODEV there, works here), so only MAP_PRIVATE is compared. */
    fd = open("mm", O_CREAT | O_RDWR | O_TRUNC, 0644);
    for (int j = 0; j < 10000; j++) buf[j] = (char)('a' + j % 26);
    write(fd, buf, 10000);
    char *m = mmap(NULL, 8192, PROT_READ, MAP_PRIVATE, fd, 4096);
    R("mmap private", m == MAP_FAILED ? -1 : 0);
    if (m != MAP_FAILED) {
        R("mmap sum", sum(m, 10000 - 4096) == sum(buf + 4096, 10000 - 4096));
        R("mmap past end zero", m[8191] == 0);
        munmap(m, 8192);
    }
    m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    R("mmap private rw", m == MAP_FAILED ? -1 : 0);
    if (m != MAP_FAILED) {
        m[0] = 'Z';
        char c = 0; pread(fd, &c, 1, 0);
        R("private write not in file", c == 'a');
        munmap(m, 4096);
    }
    R("mmap bad offset", mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 100) == MAP_FAILED ? -1 : 0);
    close(fd);
    fd = open("mm", O_WRONLY);
    R("mmap write-only fd", mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0) == MAP_FAILED ? -1 : 0);
    close(fd);
    list(".");
    return 0;
}
