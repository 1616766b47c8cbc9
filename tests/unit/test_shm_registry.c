/* test_shm_registry.c — system shared memory regions: what registration
 * checks, spans within bounds, read-only objects, an object shrunk (and
 * grown back) under a registered region, unregistering a region a request
 * still holds, keys that are no shared memory object (FIFO, directory,
 * symbolic link, socket) and the cap on registered regions. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "shm_registry.h"

static char key[64];

/* A fresh shm object of size bytes, filled with 0..255 repeating. */
static void make_object(size_t size, mode_t mode)
{
    snprintf(key, sizeof key, "/tp_test_shm_%d", (int)getpid());
    shm_unlink(key);
    int fd = shm_open(key, O_RDWR | O_CREAT | O_EXCL, mode);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
    unsigned char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    for (size_t i = 0; i < size; i++)
        p[i] = (unsigned char)i;
    munmap(p, size);
    close(fd);
}

static void expect(tp_status got, tp_status want, const tp_err *e, const char *words)
{
    ck_assert_msg(got == want, "status %s: %s", tp_status_name(got), e->msg);
    ck_assert_msg(strstr(e->msg, words), "'%s' lacks '%s'", e->msg, words);
}

START_TEST(register_checks)
{
    make_object(8192, 0600);
    tp_shm_registry *g = tp_shm_registry_create(16);
    tp_err e = {{0}};
    expect(tp_shm_register(g, "a/b", key, 0, 8, &e), TP_INVALID, &e, "region name");
    expect(tp_shm_register(g, "r", "no_slash", 0, 8, &e), TP_INVALID, &e, "not a shm_open name");
    expect(tp_shm_register(g, "r", "/a/b", 0, 8, &e), TP_INVALID, &e, "not a shm_open name");
    expect(tp_shm_register(g, "r", "/tp_test_missing_x", 0, 8, &e), TP_NOT_FOUND, &e,
           "cannot open");
    expect(tp_shm_register(g, "r", key, 8000, 200, &e), TP_INVALID, &e, "does not fit");
    expect(tp_shm_register(g, "r", key, UINT64_MAX, 2, &e), TP_INVALID, &e, "does not fit");
    expect(tp_shm_register(g, "r", key, 0, 0, &e), TP_INVALID, &e, "byte_size 0 (a region holds at least one byte)");
    /* an offset that is not page aligned: offsets count from the region */
    ck_assert_int_eq(tp_shm_register(g, "r", key, 4100, 100, &e), TP_OK);
    expect(tp_shm_register(g, "r", key, 0, 8, &e), TP_INVALID, &e, "already registered");
    tp_shm_region *r = tp_shm_acquire(g, "r", &e);
    ck_assert_ptr_nonnull(r);
    unsigned char got[100];
    ck_assert_int_eq(tp_shm_read(r, 10, got, 90, &e), TP_OK);
    for (int i = 0; i < 90; i++)
        ck_assert_int_eq(got[i], (unsigned char)((4110 + i) & 255));
    expect(tp_shm_write(r, 10, got, 91, &e), TP_INVALID, &e, "exceed its byte_size 100");
    expect(tp_shm_read(r, 10, got, 91, &e), TP_INVALID, &e, "exceed its byte_size 100");
    expect(tp_shm_write(r, UINT64_MAX, got, 1, &e), TP_INVALID, &e, "exceed");
    tp_shm_release(r);
    tp_shm_registry_free(g);
    shm_unlink(key);
}
END_TEST

START_TEST(status_and_unregister_in_use)
{
    make_object(4096, 0600);
    tp_shm_registry *g = tp_shm_registry_create(16);
    tp_err e = {{0}};
    tp_status st;
    ck_assert_int_eq(tp_shm_register(g, "one", key, 0, 4096, &e), TP_OK);
    ck_assert_int_eq(tp_shm_register(g, "two", key, 16, 32, &e), TP_OK);
    char *doc = tp_shm_status_json(g, "two", &st, &e);
    char want[256];
    snprintf(want, sizeof want, "[{\"name\":\"two\",\"key\":\"%s\",\"offset\":16,\"byte_size\":32}]",
             key);
    ck_assert_str_eq(doc, want);
    free(doc);
    ck_assert_ptr_null(tp_shm_status_json(g, "three", &st, &e));
    ck_assert_int_eq(st, TP_NOT_FOUND);
    /* a request holds "one" while it is unregistered: its object stays open
     * until the request lets go, and the name is gone at once */
    tp_shm_region *held = tp_shm_acquire(g, "one", &e);
    ck_assert_int_eq(tp_shm_unregister(g, "one", &e), TP_OK);
    ck_assert_ptr_null(tp_shm_acquire(g, "one", &e));
    unsigned char sevens[96], back[96];
    memset(sevens, 7, sizeof sevens);
    ck_assert_int_eq(tp_shm_write(held, 4000, sevens, 96, &e), TP_OK);
    ck_assert_int_eq(tp_shm_read(held, 4000, back, 96, &e), TP_OK);
    ck_assert_mem_eq(back, sevens, 96);
    tp_shm_release(held); /* the object is closed here */
    expect(tp_shm_unregister(g, "one", &e), TP_NOT_FOUND, &e, "no shared memory region 'one'");
    ck_assert_int_eq(tp_shm_unregister(g, NULL, &e), TP_OK);
    doc = tp_shm_status_json(g, NULL, &st, &e);
    ck_assert_str_eq(doc, "[]");
    free(doc);
    tp_shm_registry_free(g);
    shm_unlink(key);
}
END_TEST

static off_t object_size(void)
{
    struct stat st;
    int fd = shm_open(key, O_RDONLY, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(fstat(fd, &st), 0);
    close(fd);
    return st.st_size;
}

static void resize_object(off_t size)
{
    int fd = shm_open(key, O_RDWR, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, size), 0);
    close(fd);
}

/* An object the client shrinks after registration: reads and writes are
 * refused with the region, the span and the object's current size (never a
 * fault: the server copies with pread/pwrite), a write never grows the
 * object back, and once the client grows it again the region works. */
START_TEST(shrunk_object)
{
    make_object(8192, 0600);
    tp_shm_registry *g = tp_shm_registry_create(16);
    tp_err e = {{0}};
    ck_assert_int_eq(tp_shm_register(g, "r", key, 4096, 4096, &e), TP_OK);
    tp_shm_region *r = tp_shm_acquire(g, "r", &e);
    unsigned char buf[64] = {0};
    resize_object(100); /* below the region's start */
    expect(tp_shm_read(r, 0, buf, 16, &e), TP_INVALID, &e,
           "region 'r': cannot read 16 bytes at offset 0: key");
    ck_assert_msg(strstr(e.msg, "holds 100 bytes now"), "%s", e.msg);
    expect(tp_shm_write(r, 0, buf, 16, &e), TP_INVALID, &e, "cannot write 16 bytes at offset 0");
    ck_assert_int_eq(object_size(), 100);
    resize_object(4096 + 40); /* into the region: a span across the end is short */
    expect(tp_shm_read(r, 8, buf, 64, &e), TP_INVALID, &e, "holds 4136 bytes now");
    ck_assert_int_eq(tp_shm_read(r, 8, buf, 32, &e), TP_OK); /* what is still there reads */
    expect(tp_shm_write(r, 8, buf, 64, &e), TP_INVALID, &e, "cannot write 64 bytes at offset 8");
    ck_assert_int_eq(object_size(), 4136);
    resize_object(8192); /* grown back: zeros where it was cut */
    memset(buf, 9, sizeof buf);
    ck_assert_int_eq(tp_shm_write(r, 4000, buf, 64, &e), TP_OK);
    ck_assert_int_eq(tp_shm_read(r, 40, buf, 64, &e), TP_OK);
    for (int i = 0; i < 64; i++)
        ck_assert_int_eq(buf[i], 0);
    tp_shm_release(r);
    tp_shm_registry_free(g);
    shm_unlink(key);
}
END_TEST

/* An object the server may only read: registered read-only, refused as an
 * output. (Skipped as root, who may write anything.) */
START_TEST(read_only_object)
{
    if (geteuid() == 0) {
        fprintf(stderr, "read_only_object: skipped as root (permissions do not apply)\n");
        return;
    }
    make_object(4096, 0400);
    tp_shm_registry *g = tp_shm_registry_create(16);
    tp_err e = {{0}};
    ck_assert_int_eq(tp_shm_register(g, "ro", key, 0, 4096, &e), TP_OK);
    tp_shm_region *r = tp_shm_acquire(g, "ro", &e);
    unsigned char buf[16];
    ck_assert_int_eq(tp_shm_read(r, 0, buf, 16, &e), TP_OK);
    expect(tp_shm_write(r, 0, buf, 16, &e), TP_INVALID, &e, "read-only");
    tp_shm_release(r);
    tp_shm_registry_free(g);
    shm_unlink(key);
}
END_TEST

/* The path under /dev/shm that shm_open uses for the key "/NAME_pid", which
 * goes to k. */
static void odd_key(const char *name, char *k, size_t ksize, char *path, size_t psize)
{
    snprintf(k, ksize, "/tp_test_%s_%d", name, (int)getpid());
    snprintf(path, psize, "/dev/shm%s", k);
    unlink(path);
    rmdir(path);
}

/* Root becomes nobody, so that permissions apply; 0 if it cannot (a user
 * namespace without 65534 mapped, say), said on stderr. */
static int drop_root(void)
{
    if (geteuid() != 0 || (setgroups(0, NULL) == 0 && setresgid(65534, 65534, 65534) == 0 &&
                           setresuid(65534, 65534, 65534) == 0))
        return 1;
    fprintf(stderr, "register_unprivileged: cannot become nobody (%s): registering as root, "
            "which opens the key read-write\n", strerror(errno));
    return 0;
}

/* Registers k in a child process that is not root (root becomes nobody
 * first), so that read-write is refused and the read-only open is tried:
 * on a FIFO that open used to wait for a writer for ever. A hang is caught
 * by Check's timeout (the child dies with the test: PR_SET_PDEATHSIG). The
 * child's status and message come back through a pipe. */
static tp_status register_unprivileged(const char *k, tp_err *e)
{
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        tp_err ce = {{0}};
        drop_root();
        tp_shm_registry *g = tp_shm_registry_create(4);
        tp_status st = tp_shm_register(g, "odd", k, 0, 8, &ce);
        tp_shm_registry_free(g);
        int ok = write(p[1], &st, sizeof st) == sizeof st &&
                 write(p[1], ce.msg, sizeof ce.msg) == sizeof ce.msg;
        _exit(ok ? 0 : 1);
    }
    close(p[1]);
    tp_status st = TP_INTERNAL;
    ck_assert_int_eq(read(p[0], &st, sizeof st), sizeof st);
    ck_assert_int_eq(read(p[0], e->msg, sizeof e->msg), sizeof e->msg);
    close(p[0]);
    int ws = 0;
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "child status %d", ws);
    return st;
}

/* A FIFO key: refused at once naming it, whether the server may open it
 * read-write (root: the open succeeds, fstat refuses) or only read-only
 * (mode 0444, opened by a non-root process: the open that used to block
 * until a writer came, which hung the HTTP thread, its probes and
 * SIGTERM). */
START_TEST(fifo_key)
{
    char k[64], path[96];
    odd_key("fifo", k, sizeof k, path, sizeof path);
    ck_assert_int_eq(mkfifo(path, 0444), 0);
    ck_assert_int_eq(chmod(path, 0444), 0); /* whatever the umask */
    tp_err e = {{0}};
    const char *want = "is a FIFO, not a shared memory object";
    expect(register_unprivileged(k, &e), TP_INVALID, &e, want);
    ck_assert_msg(strstr(e.msg, "region 'odd'") && strstr(e.msg, k), "%s", e.msg);
    tp_shm_registry *g = tp_shm_registry_create(4);
    expect(tp_shm_register(g, "f", k, 0, 8, &e), TP_INVALID, &e, want);
    ck_assert_int_eq(tp_shm_count(g), 0);
    tp_shm_registry_free(g);
    unlink(path);
}
END_TEST

/* A directory, a symbolic link (even to a good object) and a socket are
 * refused as the client's error (400), naming what the key is; a symbolic
 * link and a directory used to be TP_IO (500). */
START_TEST(other_non_objects)
{
    char k[64], path[96];
    tp_err e = {{0}};
    tp_shm_registry *g = tp_shm_registry_create(4);
    odd_key("dir", k, sizeof k, path, sizeof path);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    expect(tp_shm_register(g, "d", k, 0, 8, &e), TP_INVALID, &e,
           "is a directory, not a shared memory object");
    expect(register_unprivileged(k, &e), TP_INVALID, &e, "is a directory");
    rmdir(path);

    make_object(4096, 0644);
    char target[96];
    snprintf(target, sizeof target, "/dev/shm%s", key);
    odd_key("link", k, sizeof k, path, sizeof path);
    ck_assert_int_eq(symlink(target, path), 0);
    expect(tp_shm_register(g, "l", k, 0, 8, &e), TP_INVALID, &e,
           "is a symbolic link, not a shared memory object");
    ck_assert_msg(strstr(e.msg, "region 'l'") && strstr(e.msg, k), "%s", e.msg);
    unlink(path);
    shm_unlink(key);

    odd_key("sock", k, sizeof k, path, sizeof path);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    ck_assert_int_eq(bind(s, (struct sockaddr *)&a, sizeof a), 0);
    expect(tp_shm_register(g, "s", k, 0, 8, &e), TP_INVALID, &e, "is a socket");
    close(s);
    unlink(path);

    /* a device (root may make one): /dev/null's numbers; refused as one,
     * or, where /dev/shm is mounted nodev, because it cannot be opened */
    odd_key("dev", k, sizeof k, path, sizeof path);
    if (mknod(path, S_IFCHR | 0666, makedev(1, 3)) == 0) {
        ck_assert_int_eq(tp_shm_register(g, "c", k, 0, 8, &e), TP_INVALID);
        ck_assert_msg(strstr(e.msg, "is a character device") || strstr(e.msg, "cannot open"),
                      "%s", e.msg);
        unlink(path);
    }
    ck_assert_int_eq(tp_shm_count(g), 0);
    tp_shm_registry_free(g);
}
END_TEST

/* At most max_regions are registered: one more is refused naming the limit
 * and the key, a name already registered is still told so, a refused
 * registration takes no slot, and unregistering frees one. */
START_TEST(region_cap)
{
    make_object(4096, 0600);
    tp_shm_registry *g = tp_shm_registry_create(3);
    tp_err e = {{0}};
    ck_assert_int_eq(tp_shm_register(g, "r0", key, 0, 8, &e), TP_OK);
    expect(tp_shm_register(g, "r1", key, 4000, 200, &e), TP_INVALID, &e, "does not fit");
    ck_assert_int_eq(tp_shm_register(g, "r1", key, 0, 8, &e), TP_OK);
    ck_assert_int_eq(tp_shm_register(g, "r2", key, 0, 8, &e), TP_OK);
    ck_assert_int_eq(tp_shm_count(g), 3);
    expect(tp_shm_register(g, "r3", key, 0, 8, &e), TP_INVALID, &e,
           "limit of 3 registered regions (max_shm_regions) is reached");
    ck_assert_msg(strstr(e.msg, "'r3'") && strstr(e.msg, key), "%s", e.msg);
    expect(tp_shm_register(g, "r0", key, 0, 8, &e), TP_INVALID, &e, "already registered");
    ck_assert_int_eq(tp_shm_unregister(g, "r1", &e), TP_OK);
    ck_assert_int_eq(tp_shm_count(g), 2);
    ck_assert_int_eq(tp_shm_register(g, "r3", key, 0, 8, &e), TP_OK);
    expect(tp_shm_register(g, "r4", key, 0, 8, &e), TP_INVALID, &e, "limit of 3");
    ck_assert_int_eq(tp_shm_unregister(g, NULL, &e), TP_OK); /* all: every slot back */
    ck_assert_int_eq(tp_shm_count(g), 0);
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "n%d", i);
        ck_assert_int_eq(tp_shm_register(g, name, key, 0, 8, &e), TP_OK);
    }
    expect(tp_shm_register(g, "n3", key, 0, 8, &e), TP_INVALID, &e, "limit of 3");
    tp_shm_registry_free(g);
    shm_unlink(key);
}
END_TEST

static Suite *shm_suite(void)
{
    Suite *s = suite_create("shm_registry");
    TCase *t = tcase_create("regions");
    tcase_add_test(t, register_checks);
    tcase_add_test(t, status_and_unregister_in_use);
    tcase_add_test(t, shrunk_object);
    tcase_add_test(t, read_only_object);
    tcase_add_test(t, fifo_key);
    tcase_add_test(t, other_non_objects);
    tcase_add_test(t, region_cap);
    suite_add_tcase(s, t);
    return s;
}

TP_CHECK_MAIN(shm_suite)
