/* The kernel's floor under the daemon's per-object file protocol: what the system calls alone
 * cost per small object, with no Python, no threads handing objects over and no other process.
 *
 *   floor CACHE_DIR RAM_DIR MODE OBJECTS SIZE
 *
 * One thread plays both processes, one object after the other, and counts its own CPU (user +
 * system, CLOCK_THREAD_CPUTIME_ID) per side; a second thread is the store, sending bodies over
 * one loopback TCP connection (its CPU is not counted, as the store's is not the daemon's).
 * Per object:
 *
 * - downloader: receive SIZE bytes; take a spare (renameat2 RENAME_NOREPLACE) as the .part, or
 *   create it; pwrite the body; close; the meta the same way, 100 bytes; rename .part into
 *   ready/ (prefetchd/exactly_once/__init__.py, "The downloader publishes an object");
 * - writer: rename ready/ -> claimed/; open, read and close the meta; open, fstat, pread the
 *   object into its own buffer, close; writev the framed record (12-byte header, body, 4-byte
 *   footer) to a shard on RAM_DIR; empty the claimed file and the meta (open O_TRUNC, close) and
 *   rename each to a spare. Every 200 objects the shard is emptied (published and read).
 *
 * MODE: "files" (the above), "creates" (every .part and meta created new and deleted, never a
 * spare: the first window of a run), "nometa" (the above without the meta), "pack" (the body
 * appended to one cache file and read back from it, holes punched behind the writer: no inode
 * work per object at all), "zerocopy" (files, but the writer moves the body from the claimed
 * file into the shard with sendfile, no pread into its own buffer: the record's CRC would come
 * with the meta, taken by the engine as it received the body; the header is one write and
 * the footer rides on the next object's header). Prints one line: mode, downloader
 * ms/object, writer ms/object.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

enum mode { FILES, CREATES, NOMETA, PACK, ZEROCOPY };

static long objects, size;
static int listen_fd;

static void die(const char *what) {
    perror(what);
    exit(1);
}

static double thread_cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *store(void *unused) {
    (void)unused;
    int c = accept(listen_fd, NULL, NULL);
    if (c < 0) die("accept");
    char *body = malloc((size_t)size);
    memset(body, 7, (size_t)size);
    for (long i = 0; i < objects; i++) {
        for (long off = 0; off < size;) {
            ssize_t n = write(c, body + off, (size_t)(size - off));
            if (n <= 0) return NULL;
            off += n;
        }
    }
    free(body);
    close(c);
    return NULL;
}

static int connect_store(void) {
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    socklen_t len = sizeof sa;
    if (bind(listen_fd, (struct sockaddr *)&sa, sizeof sa) || listen(listen_fd, 1) ||
        getsockname(listen_fd, (struct sockaddr *)&sa, &len))
        die("listen");
    pthread_t t;
    pthread_create(&t, NULL, store, NULL);
    pthread_detach(t);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(s, (struct sockaddr *)&sa, sizeof sa)) die("connect");
    return s;
}

/* A new private file at ``path``: a spare renamed there if there is one, else created. */
static int take(const char *cache, long *spares, long next_spare, const char *path, int access) {
    if (*spares > 0) {
        char spare[512];
        snprintf(spare, sizeof spare, "%s/.tmp/spare-%ld", cache, next_spare - *spares);
        (*spares)--;
        if (renameat2(AT_FDCWD, spare, AT_FDCWD, path, RENAME_NOREPLACE)) die("renameat2");
        return open(path, access | O_NOFOLLOW | O_CLOEXEC);
    }
    return open(path, access | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
}

/* ``path`` done with: emptied and renamed to a spare, or deleted. */
static void give(const char *cache, long *spares, long *next_spare, const char *path, int keep) {
    if (!keep) {
        unlink(path);
        return;
    }
    int fd = open(path, O_WRONLY | O_TRUNC | O_NOFOLLOW | O_CLOEXEC);
    close(fd);
    char spare[512];
    snprintf(spare, sizeof spare, "%s/.tmp/spare-%ld", cache, (*next_spare)++);
    if (rename(path, spare)) die("rename");
    (*spares)++;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: floor CACHE_DIR RAM_DIR files|creates|nometa|pack|zerocopy OBJECTS SIZE\n");
        return 2;
    }
    const char *cache = argv[1], *ram = argv[2], *name = argv[3];
    enum mode mode = !strcmp(name, "creates") ? CREATES
                     : !strcmp(name, "nometa") ? NOMETA
                     : !strcmp(name, "pack")   ? PACK
                     : !strcmp(name, "zerocopy") ? ZEROCOPY
                                               : FILES;
    objects = atol(argv[4]);
    size = atol(argv[5]);
    const char *dirs[] = {".tmp", "ready", "claimed", "meta"};
    char path[512], part[512], ready[512], claimed[512], meta[512];
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", cache, dirs[i]);
        if (mkdir(path, 0700) && errno != EEXIST) die("mkdir");
    }
    snprintf(path, sizeof path, "%s/shard", ram);
    int shard = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    snprintf(path, sizeof path, "%s/.tmp/pack", cache);
    int pack = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (shard < 0 || pack < 0) die("open");
    int sock = connect_store();
    char *body = malloc((size_t)size), *record = malloc((size_t)size);
    char text[100], header[12] = {0}, footer[4] = {0};
    memset(text, 'm', sizeof text);
    long spares = 0, next_spare = 0, pack_at = 0;
    double downloader = 0, writer = 0;
    for (long i = 0; i < objects; i++) {
        double t0 = thread_cpu();
        for (long off = 0; off < size;) {
            ssize_t n = recv(sock, body + off, (size_t)(size - off), 0);
            if (n <= 0) die("recv");
            off += n;
        }
        snprintf(part, sizeof part, "%s/.tmp/o%08ld.part", cache, i);
        snprintf(ready, sizeof ready, "%s/ready/o%08ld", cache, i);
        snprintf(claimed, sizeof claimed, "%s/claimed/w0-o%08ld", cache, i);
        snprintf(meta, sizeof meta, "%s/meta/o%08ld.json", cache, i);
        if (mode == PACK) {
            if (pwrite(pack, body, (size_t)size, pack_at) != size) die("pwrite");
        } else {
            int fd = take(cache, &spares, next_spare, part, O_RDWR);
            if (fd < 0 || pwrite(fd, body, (size_t)size, 0) != size) die("part");
            close(fd);
            if (mode != NOMETA) {
                int m = take(cache, &spares, next_spare, meta, O_WRONLY);
                if (m < 0 || write(m, text, sizeof text) != sizeof text) die("meta");
                close(m);
            }
            if (rename(part, ready)) die("rename part");
        }
        double t1 = thread_cpu();
        struct iovec frame[3] = {{header, 12}, {record, (size_t)size}, {footer, 4}};
        if (mode == PACK) {
            if (pread(pack, record, (size_t)size, pack_at) != size) die("pread pack");
            pack_at += size;
            if (pack_at % (64 * size) == 0)
                fallocate(pack, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, pack_at);
        } else {
            if (rename(ready, claimed)) die("claim");
            if (mode != NOMETA) {
                int m = open(meta, O_RDONLY | O_CLOEXEC);
                if (m < 0 || read(m, text, sizeof text) != sizeof text) die("read meta");
                close(m);
            }
            int fd = open(claimed, O_RDONLY | O_CLOEXEC);
            struct stat st;
            if (fd < 0 || fstat(fd, &st)) die("open object");
            if (mode == ZEROCOPY) {
                /* the previous record's footer and this one's header in one write */
                struct iovec head[2] = {{footer, i % 200 ? 4 : 0}, {header, 12}};
                off_t from = 0;
                if (writev(shard, head, 2) < 12 ||
                    sendfile(shard, fd, &from, (size_t)st.st_size) != size)
                    die("sendfile");
            } else if (pread(fd, record, (size_t)st.st_size, 0) != size) {
                die("read object");
            }
            close(fd);
        }
        if (mode != ZEROCOPY && writev(shard, frame, 3) != size + 16) die("writev");
        if (mode != PACK) {
            give(cache, &spares, &next_spare, claimed, mode != CREATES);
            if (mode != NOMETA) give(cache, &spares, &next_spare, meta, mode != CREATES);
        }
        if (i % 200 == 199 && (ftruncate(shard, 0) || lseek(shard, 0, SEEK_SET))) die("shard");
        writer += thread_cpu() - t1;
        downloader += t1 - t0;
    }
    printf("%s %.4f %.4f\n", name, downloader * 1e3 / (double)objects, writer * 1e3 / (double)objects);
    return 0;
}
