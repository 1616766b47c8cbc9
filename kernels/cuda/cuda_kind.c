/* cuda_kind.c — the cuda backend's registry entry (engine/backend.c): what
 * it can do, known without a device, and how it is created: one rank per
 * process (one GPU each), joined into one NCCL communicator whose id the
 * leader sends to every worker before joining itself.
 *
 * This file is all of the cuda backend a cuda build's tpserve contains (it
 * links no CUDA library). The device code is libtpserve-cuda.so (the rest
 * of kernels/cuda, linked with libcudart, libcublasLt and libnccl), loaded
 * as ggml loads a GGML_BACKEND_DL backend: only when a cuda backend is
 * created, or when `auto` probes on a machine with an NVIDIA GPU device
 * node. A cpu server and its rank processes so map no CUDA library (about
 * 150 MB of cuBLASLt alone). */
#include <dlfcn.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_backend.h"

#ifndef TP_CUDA_LIBDIR
#define TP_CUDA_LIBDIR "/usr/local/lib/tpserve"
#endif

/* Set (to anything but "0"): `auto` loads the library and asks CUDA even
 * without a GPU device node in /dev (nodes made elsewhere). */
#define CUDA_PROBE_ENV "TP_CUDA_PROBE"

static const tp_backend_caps cuda_caps = {
    /* one_shot (peer-mapped symmetric buffers) below the thresholds, as on
     * cpu; NCCL above them and for every other collective */
    .lowering = {.one_shot_max_bytes = TP_ONE_SHOT_MAX_BYTES_DEFAULT,
                 .large_all_reduce = TP_ALGO_NCCL,
                 .other_collectives = TP_ALGO_NCCL},
    .dma_input_copies = 1,
    /* FP16/BF16 run as such: halves the bytes every kernel moves, and the
     * tensor cores take them */
    .f32_activations = 0,
};

/* cuda_ops.c maps every kernel family to a kernel (TP_FAMILY_KERNELS), so
 * every compute op has one; the library agrees or is refused (load_checked),
 * and test_cuda_host checks the two op by op. */
static int cuda_supports_op(tp_op op, tp_dtype dtype)
{
    (void)dtype; /* the kernels take every dtype shape inference lets through */
    tp_op_kind k = tp_op_kind_of(op);
    return k == TP_KIND_COLLECTIVE || k == TP_KIND_FUSED || tp_op_family(op) > TP_FAMILY_NONE;
}

int tp_cuda_gpu_node(const char *dir, char *name, size_t len)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int found = 0;
    for (struct dirent *de; !found && (de = readdir(d));) {
        const char *n = de->d_name;
        if (strncmp(n, "nvidia", 6) != 0 || !n[6])
            continue;
        found = 1;
        for (const char *c = n + 6; *c && found; c++)
            found = *c >= '0' && *c <= '9';
        if (found)
            snprintf(name, len, "%s/%s", dir, n);
    }
    closedir(d);
    return found;
}

/* ------------------------------------------------------------ the library */

/* Defined when the device code is linked in (test binaries, the CUDA
 * double's tpserve): then nothing is loaded. Weak so that tpserve, which
 * does not link it, still links. */
extern const tp_cuda_device_api tp_cuda_device_entry __attribute__((weak));

static struct {
    pthread_once_t once;
    const tp_cuda_device_api *api; /* NULL: error says why */
    char error[1600];
} device = {.once = PTHREAD_ONCE_INIT};

/* The directory of this executable. */
static int exe_dir(char *dir, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", dir, len - 1);
    if (n <= 0)
        return -1;
    dir[n] = '\0';
    char *slash = strrchr(dir, '/');
    if (!slash)
        return -1;
    *slash = '\0';
    return 0;
}

/* Whether api was built from this tpserve's op table; else why. */
static int agrees(const tp_cuda_device_api *api, const char *path, char *why, size_t len)
{
    if (api->size != sizeof *api || api->op_count != TP_OP_COUNT) {
        snprintf(why, len, "%.300s was built from another tpserve (%zu-byte entry, %d ops; this tpserve: %zu, %d): "
                 "rebuild both together", path, api->size, api->op_count, sizeof *api, (int)TP_OP_COUNT);
        return 0;
    }
    for (int i = 0; i < TP_OP_COUNT; i++) {
        tp_op op = (tp_op)i;
        tp_op_kind k = tp_op_kind_of(op);
        int has = api->has_kernel(op);
        if (k == TP_KIND_SOURCE || k == TP_KIND_VIEW || k == TP_KIND_COLLECTIVE || k == TP_KIND_FUSED ||
            has == cuda_supports_op(op, TP_F32))
            continue;
        snprintf(why, len, "%.300s %s a kernel for op '%s' but cuda_kind.c's capabilities say it %s "
                 "(cuda_supports_op must follow cuda_ops.c)", path, has ? "has" : "has no", tp_op_name(op),
                 has ? "has none" : "has one");
        return 0;
    }
    return 1;
}

/* 1: path loaded into *api; 0: it could not be opened; -1: it opened but
 * is refused. why says why when not 1. */
static int open_library(const char *path, const tp_cuda_device_api **api, char *why, size_t len)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    const tp_cuda_device_api *entry = h ? dlsym(h, "tp_cuda_device_entry") : NULL;
    if (!entry) {
        const char *e = dlerror();
        e = e ? e : "no tp_cuda_device_entry";
        snprintf(why, len, "%.300s%s%.400s", strstr(e, path) ? "" : path, strstr(e, path) ? "" : ": ", e);
        if (h)
            dlclose(h);
        return h ? -1 : 0;
    }
    if (!agrees(entry, path, why, len)) {
        dlclose(h);
        return -1;
    }
    *api = entry;
    return 1;
}

/* Next to the executable (a build directory, or a relocated install),
 * then the install libdir; the first that opens is the one used. */
static void load_once(void)
{
    if (&tp_cuda_device_entry) {
        device.api = &tp_cuda_device_entry;
        return;
    }
    char dir[1024], path[2][1024 + sizeof TP_CUDA_LIBRARY + 1], why[2][720]; /* a rank thread's stack */
    int n = 0;
    if (exe_dir(dir, sizeof dir) == 0)
        snprintf(path[n++], sizeof path[0], "%s/%s", dir, TP_CUDA_LIBRARY);
    snprintf(path[n++], sizeof path[0], "%s/%s", TP_CUDA_LIBDIR, TP_CUDA_LIBRARY);
    for (int i = 0; i < n; i++) {
        int r = open_library(path[i], &device.api, why[i], sizeof why[i]);
        if (r == 1)
            return;
        if (r < 0) {
            snprintf(device.error, sizeof device.error, "cuda backend: %s", why[i]);
            return;
        }
    }
    snprintf(device.error, sizeof device.error, "cuda backend: cannot load its device code %s: %s%s%s",
             TP_CUDA_LIBRARY, why[0], n > 1 ? "; " : "", n > 1 ? why[1] : "");
}

/* The device code, loaded on first use; NULL with the reason in err. */
static const tp_cuda_device_api *device_code(tp_err *err)
{
    pthread_once(&device.once, load_once);
    if (!device.api)
        tp_fail(err, TP_UNAVAILABLE, "%s", device.error);
    return device.api;
}

/* ------------------------------------------------------------ the kind */

static int cuda_probe(char *why, size_t len)
{
    char node[300];
    const char *force = getenv(CUDA_PROBE_ENV);
    if (!tp_cuda_gpu_node("/dev", node, sizeof node) && !(force && *force && strcmp(force, "0") != 0)) {
        snprintf(why, len, "no NVIDIA GPU device node in /dev (%s not loaded; %s=1 loads it anyway)",
                 TP_CUDA_LIBRARY, CUDA_PROBE_ENV);
        return 0;
    }
    tp_err err = {{0}};
    const tp_cuda_device_api *api = device_code(&err);
    if (!api) {
        snprintf(why, len, "%s", err.msg);
        return 0;
    }
    return api->probe(why, len);
}

static tp_status cuda_create_threads(int world, const tp_backend_settings *s, tp_backend **out, tp_err *err)
{
    if (world > 1)
        return tp_fail(err, TP_INVALID, "backend 'cuda' runs one process per GPU: world_size %d needs ranks=processes "
                       "(--ranks processes)", world);
    const tp_cuda_device_api *api = device_code(err);
    return api ? api->create(1, 0, NULL, s, out, err) : TP_UNAVAILABLE;
}

static tp_status cuda_group_message(char *msg, size_t cap, tp_err *err)
{
    char id[TP_CUDA_NCCL_ID_HEX + 1];
    const tp_cuda_device_api *api = device_code(err);
    tp_status st = api ? api->nccl_id_new(id, err) : TP_UNAVAILABLE;
    if (st == TP_OK && (size_t)snprintf(msg, cap, "%s", id) >= cap)
        return tp_fail(err, TP_INTERNAL, "cuda backend: the NCCL id does not fit the group message");
    return st;
}

static tp_status cuda_group_join(const tp_backend_group *g, const char *msg, const tp_backend_settings *s,
                                 tp_backend **out, tp_err *err)
{
    /* creation runs as timed steps of the group (cuda_backend.c, A7), which
     * also page-lock the group's request staging */
    const tp_cuda_device_api *api = device_code(err);
    return api ? api->create_in_group(g->group, msg, s, out, err) : TP_UNAVAILABLE;
}

const tp_backend_kind tp_cuda_backend_kind = {
    .name = "cuda",
    .caps = &cuda_caps,
    .supports_op = cuda_supports_op,
    .probe = cuda_probe,
    .one_rank_per_process = 1,
    .share_before_join = 1, /* ncclCommInitRank blocks until every rank joins */
    .create = cuda_create_threads,
    .group_message = cuda_group_message,
    .group_join = cuda_group_join,
};
