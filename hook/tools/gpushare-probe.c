/* gpushare-probe: exercises a CUDA driver the way the CUDA runtime reaches it
 * (dlopen("libcuda.so.1") + cuGetProcAddress), against a real or the simulated driver.
 * Output: plain key=value lines.
 *
 *   gpushare-probe [--main-exits] [--device N] alloc --chunk BYTES [--max BYTES] [--hold SECONDS] [--api A]
 *       A = alloc (default) | managed | async | pitch | vmm
 *   gpushare-probe [--device N] meminfo
 *   gpushare-probe [--device N] launch --seconds T [--kernel-us US] [--streams N] [--on-ms MS --off-ms MS]
 *                  [--warmup W]
 *       kernels flat out, round robin over N streams (default 1: the legacy stream); --on-ms:
 *       bursty: bursts of MS of GPU work (at the kernel length asked for), each waited for, then
 *       --off-ms idle; --warmup: run W seconds first, counted in nothing printed (a claim's first
 *       slot period, before its costs are known, moves a share measured over a few periods)
 *   gpushare-probe [--device N] time --count N [--kernel-us US]
 *       event-pair time of single kernels (median, p90), each waited for
 *   gpushare-probe [--device N] serve --seconds T [--interval-us US] [--request-us US] [--kernels K]
 *       an inference-like client: a request of K kernels, waited for, then interval of think time
 *   gpushare-probe [--device N] graph --seconds T [--kernel-us US] [--nodes N] [--mode global|thread|relaxed]
 *                  [--side-us US] [--record 1]
 *       capture N kernels on a stream into a CUDA graph, then replay it flat out; --side-us: while
 *       capturing, also launch kernels on another stream, 2 ms apart; --record: record an event
 *       on the capturing stream (the capture must fail)
 *
 *   gpushare-probe [--device N] replay --trace FILE --seconds T [--warmup W | --window-at S]
 *       a framework-shaped workload: the trace's steps, one after another (format below);
 *       prints steps done in the window, the GPU time they asked for, and each step's latency
 *
 *   --main-exits: the command runs on a second thread and the main thread calls pthread_exit (a
 *   zombie main thread, which reads "/" as its cgroup: the node agent must look at the others)
 *
 *   launch, time, serve and graph take --grid BLOCKS: the blocks of each kernel (default: the
 *   GPU's SM count, a kernel that fills the GPU; fewer is a small kernel, which MPS can run
 *   beside another client's)
 *
 *   A trace (hook/traces/NAME.trace) is one step of a workload, one op a line, '#' to the line's end
 *   a comment; a line may end in xN (the op N times):
 *       kernel US [grid=BLOCKS] [stream=S] [host=US]
 *           a kernel of US microseconds of GPU time (a spin kernel), on stream S (0, the default:
 *           the legacy stream; 1-7: streams of their own), after US of CPU work on the launching
 *           thread (an eager framework's dispatch: Python, the op's checks, the allocator)
 *       host US      the CPU busy for US (the optimizer's host side, a loss printed, data prepared)
 *       idle US      the CPU asleep for US (waiting for data or the next request)
 *       sync         wait for all the work launched (cuCtxSynchronize: a loss.item(), a response)
 *       graph begin / graph end
 *           the kernels between are captured once into a CUDA graph on a stream of their own and
 *           replayed as one launch where `graph begin` stands (torch.cuda.graph, CUDA-graph serving)
 *       repeat N / end
 *           the ops between, N times (a model's layers); not nested
 *   A step's latency runs from its first op to the end of its last sync; a trace needs a sync.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../src/cuda_abi.h"

/* a busy loop of `cycles` clock ticks: real GPUs need a kernel; the simulator accepts any */
static const char spin_ptx[] =
    ".version 6.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    ".visible .entry spin(.param .u64 spin_param_0)\n"
    "{\n"
    "  .reg .pred %p<2>;\n"
    "  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [spin_param_0];\n"
    "  mov.u64 %rd2, %clock64;\n"
    "  add.s64 %rd3, %rd2, %rd1;\n"
    "$L_loop:\n"
    "  mov.u64 %rd4, %clock64;\n"
    "  setp.lt.u64 %p1, %rd4, %rd3;\n"
    "  @%p1 bra $L_loop;\n"
    "  ret;\n"
    "}\n";

static __typeof__(&cuGetProcAddress_v2) p_getproc;
#define FN(sym) static __typeof__(&sym) p_##sym
FN(cuInit); FN(cuDeviceGet); FN(cuDeviceGetAttribute); FN(cuDevicePrimaryCtxRetain); FN(cuCtxSetCurrent);
FN(cuCtxSynchronize); FN(cuMemGetInfo_v2); FN(cuDeviceTotalMem_v2); FN(cuMemAlloc_v2); FN(cuMemFree_v2);
FN(cuMemAllocManaged); FN(cuMemAllocAsync); FN(cuMemFreeAsync); FN(cuMemAllocPitch_v2); FN(cuMemCreate);
FN(cuMemRelease); FN(cuModuleLoadData); FN(cuModuleGetFunction); FN(cuLaunchKernel); FN(cuEventCreate);
FN(cuEventRecord); FN(cuEventSynchronize); FN(cuEventElapsedTime); FN(cuGetErrorName);
FN(cuStreamCreate); FN(cuStreamSynchronize); FN(cuStreamBeginCapture_v2); FN(cuStreamEndCapture);
FN(cuGraphInstantiateWithFlags); FN(cuGraphLaunch); FN(cuEventQuery);

static void *get(const char *base)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult st = 0;
    if (p_getproc(base, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS || !fn) {
        printf("error=missing_symbol symbol=%s\n", base);
        exit(3);
    }
    return fn;
}

static const char *err_name(CUresult rc)
{
    const char *s = NULL;
    return p_cuGetErrorName && p_cuGetErrorName(rc, &s) == CUDA_SUCCESS && s ? s : "unknown";
}

#define CHECK(call)                                                                  \
    do {                                                                             \
        CUresult rc_ = (call);                                                       \
        if (rc_ != CUDA_SUCCESS) {                                                   \
            printf("error=%s rc=%d call=%s\n", err_name(rc_), rc_, #call);           \
            exit(2);                                                                 \
        }                                                                            \
    } while (0)

static int g_device;

static void load_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("error=no_driver detail=%s\n", dlerror());
        exit(2);
    }
    p_getproc = (__typeof__(p_getproc))dlsym(h, "cuGetProcAddress_v2");
    if (!p_getproc) {
        printf("error=no_cuGetProcAddress_v2\n");
        exit(2);
    }
#define GET(sym, base) p_##sym = (__typeof__(p_##sym))get(base)
    GET(cuGetErrorName, "cuGetErrorName");
    GET(cuInit, "cuInit"); GET(cuDeviceGet, "cuDeviceGet"); GET(cuDeviceGetAttribute, "cuDeviceGetAttribute");
    GET(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"); GET(cuCtxSetCurrent, "cuCtxSetCurrent");
    GET(cuCtxSynchronize, "cuCtxSynchronize"); GET(cuMemGetInfo_v2, "cuMemGetInfo");
    GET(cuDeviceTotalMem_v2, "cuDeviceTotalMem"); GET(cuMemAlloc_v2, "cuMemAlloc"); GET(cuMemFree_v2, "cuMemFree");
    GET(cuMemAllocManaged, "cuMemAllocManaged"); GET(cuMemAllocAsync, "cuMemAllocAsync");
    GET(cuMemFreeAsync, "cuMemFreeAsync"); GET(cuMemAllocPitch_v2, "cuMemAllocPitch");
    GET(cuMemCreate, "cuMemCreate"); GET(cuMemRelease, "cuMemRelease");
    GET(cuModuleLoadData, "cuModuleLoadData"); GET(cuModuleGetFunction, "cuModuleGetFunction");
    GET(cuLaunchKernel, "cuLaunchKernel"); GET(cuEventCreate, "cuEventCreate");
    GET(cuEventRecord, "cuEventRecord"); GET(cuEventSynchronize, "cuEventSynchronize");
    GET(cuEventElapsedTime, "cuEventElapsedTime"); GET(cuEventQuery, "cuEventQuery");
    GET(cuStreamCreate, "cuStreamCreate"); GET(cuStreamSynchronize, "cuStreamSynchronize");
    GET(cuStreamBeginCapture_v2, "cuStreamBeginCapture"); GET(cuStreamEndCapture, "cuStreamEndCapture");
    GET(cuGraphInstantiateWithFlags, "cuGraphInstantiate"); GET(cuGraphLaunch, "cuGraphLaunch");
    CUdevice dev;
    CUcontext ctx;
    CHECK(p_cuInit(0));
    CHECK(p_cuDeviceGet(&dev, g_device));
    CHECK(p_cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(p_cuCtxSetCurrent(ctx));
}

static unsigned long long parse_size(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (!strcmp(end, "Ki")) v <<= 10;
    else if (!strcmp(end, "Mi")) v <<= 20;
    else if (!strcmp(end, "Gi")) v <<= 30;
    else if (*end) {
        fprintf(stderr, "bad size %s\n", s);
        exit(64);
    }
    return v;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* one allocation of `size` by the chosen API; key identifies it for free_one */
static CUresult alloc_one(const char *api, size_t size, unsigned long long *key)
{
    if (!strcmp(api, "managed")) return p_cuMemAllocManaged(key, size, CU_MEM_ATTACH_GLOBAL);
    if (!strcmp(api, "async")) return p_cuMemAllocAsync(key, size, NULL);
    if (!strcmp(api, "pitch")) {
        size_t pitch;
        return p_cuMemAllocPitch_v2(key, &pitch, size / 64, 64, 4);
    }
    if (!strcmp(api, "vmm")) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = g_device;
        return p_cuMemCreate(key, size, &prop, 0);
    }
    return p_cuMemAlloc_v2(key, size);
}

static CUresult free_one(const char *api, unsigned long long key)
{
    if (!strcmp(api, "vmm")) return p_cuMemRelease(key);
    if (!strcmp(api, "async")) return p_cuMemFreeAsync(key, NULL);
    return p_cuMemFree_v2(key);
}

static int cmd_alloc(int argc, char **argv)
{
    unsigned long long chunk = 0, max = ~0ull;
    double hold = 0;
    const char *api = "alloc";
    for (int i = 0; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--chunk")) chunk = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "--max")) max = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "--hold")) hold = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--api")) api = argv[i + 1];
    }
    if (!chunk) {
        fprintf(stderr, "alloc needs --chunk BYTES\n");
        return 64;
    }
    load_driver();
    static unsigned long long keys[1 << 16];
    int n = 0;
    unsigned long long total = 0;
    const char *result = "max";
    while (total + chunk <= max && n < (int)(sizeof keys / sizeof keys[0])) {
        CUresult rc = alloc_one(api, chunk, &keys[n]);
        printf("step=%d rc=%d name=%s allocated=%llu\n", n, rc, err_name(rc), total + (rc ? 0 : chunk));
        if (rc != CUDA_SUCCESS) {
            result = rc == CUDA_ERROR_OUT_OF_MEMORY ? "oom" : "error";
            break;
        }
        total += chunk;
        n++;
    }
    printf("allocated=%llu chunks=%d result=%s\n", total, n, result);
    fflush(stdout);
    if (hold > 0) usleep((useconds_t)(hold * 1e6));
    int bad = 0;
    for (int i = 0; i < n; i++) bad += free_one(api, keys[i]) != CUDA_SUCCESS;
    printf("freed=%d free_errors=%d\n", n, bad);
    return 0;
}

static int cmd_meminfo(void)
{
    load_driver();
    size_t fr = 0, tot = 0, dtot = 0;
    CUresult rc = p_cuMemGetInfo_v2(&fr, &tot);
    printf("cu_rc=%d cu_free=%zu cu_total=%zu\n", rc, fr, tot);
    rc = p_cuDeviceTotalMem_v2(&dtot, g_device);
    printf("device_total=%zu\n", dtot);
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("nvml=unavailable\n");
        return 0;
    }
    nvmlReturn_t (*init)(void) = (nvmlReturn_t(*)(void))dlsym(h, "nvmlInit_v2");
    __typeof__(&nvmlDeviceGetHandleByIndex_v2) by_index = (__typeof__(by_index))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    __typeof__(&nvmlDeviceGetMemoryInfo) mem = (__typeof__(mem))dlsym(h, "nvmlDeviceGetMemoryInfo");
    __typeof__(&nvmlDeviceGetMemoryInfo_v2) mem2 = (__typeof__(mem2))dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
    nvmlDevice_t d;
    if (!init || !by_index || !mem || init() != NVML_SUCCESS || by_index((unsigned)g_device, &d) != NVML_SUCCESS) {
        printf("nvml=error\n");
        return 0;
    }
    nvmlMemory_t m;
    if (mem(d, &m) == NVML_SUCCESS) printf("nvml_total=%llu nvml_free=%llu nvml_used=%llu\n", m.total, m.free, m.used);
    nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
    if (mem2 && mem2(d, &m2) == NVML_SUCCESS)
        printf("nvml2_total=%llu nvml2_free=%llu nvml2_used=%llu\n", m2.total, m2.free, m2.used);
    return 0;
}

/* `gpus`: the GPUs NVML shows, one line each as `nvidia-smi -L` prints them. */
static int cmd_gpus(void)
{
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    nvmlReturn_t (*init)(void) = h ? (nvmlReturn_t(*)(void))dlsym(h, "nvmlInit_v2") : NULL;
    nvmlReturn_t (*count)(unsigned *) = h ? (nvmlReturn_t(*)(unsigned *))dlsym(h, "nvmlDeviceGetCount_v2") : NULL;
    __typeof__(&nvmlDeviceGetHandleByIndex_v2) by_index =
        h ? (__typeof__(by_index))dlsym(h, "nvmlDeviceGetHandleByIndex_v2") : NULL;
    nvmlReturn_t (*name)(nvmlDevice_t, char *, unsigned) =
        h ? (nvmlReturn_t(*)(nvmlDevice_t, char *, unsigned))dlsym(h, "nvmlDeviceGetName") : NULL;
    nvmlReturn_t (*uuid)(nvmlDevice_t, char *, unsigned) =
        h ? (nvmlReturn_t(*)(nvmlDevice_t, char *, unsigned))dlsym(h, "nvmlDeviceGetUUID") : NULL;
    unsigned n = 0;
    if (!init || !count || !by_index || !name || !uuid || init() != NVML_SUCCESS || count(&n) != NVML_SUCCESS) {
        fprintf(stderr, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver\n");
        return 9;
    }
    for (unsigned i = 0; i < n; i++) {
        nvmlDevice_t d;
        char product[96] = "", id[96] = "";
        if (by_index(i, &d) != NVML_SUCCESS || name(d, product, sizeof product) != NVML_SUCCESS ||
            uuid(d, id, sizeof id) != NVML_SUCCESS)
            return 9;
        printf("GPU %u: %s (UUID: %s)\n", i, product, id);
    }
    return 0;
}

static double g_seconds = 1, g_kernel_us = 100, g_interval_us = 2400, g_request_us = 410;
static int g_count = 50, g_kernels = 8, g_nodes = 10, g_record, g_grid, g_streams = 1;
static double g_on_ms, g_off_ms, g_warmup;
static int g_mark_every = 16;
static double g_window_at; /* CLOCK_MONOTONIC seconds the window starts at; 0 = now + warm-up */
static double g_side_us;
static const char *g_mode = "global";
static const char *g_trace;

static void parse_opts(int argc, char **argv)
{
    for (int i = 0; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--seconds")) g_seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--kernel-us")) g_kernel_us = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--interval-us")) g_interval_us = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--request-us")) g_request_us = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--count")) g_count = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--kernels")) g_kernels = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--nodes")) g_nodes = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--mode")) g_mode = argv[i + 1];
        else if (!strcmp(argv[i], "--trace")) g_trace = argv[i + 1];
        else if (!strcmp(argv[i], "--side-us")) g_side_us = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--record")) g_record = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--streams")) g_streams = atoi(argv[i + 1]) < 1 ? 1 : atoi(argv[i + 1]) > 64 ? 64 : atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--on-ms")) g_on_ms = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup")) g_warmup = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--off-ms")) g_off_ms = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--window-at")) g_window_at = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--mark-every")) {
            g_mark_every = atoi(argv[i + 1]);
            if (g_mark_every < 1 || g_mark_every > 16) {
                fprintf(stderr, "bad --mark-every %s: kernels between the window's events, 1 to 16\n", argv[i + 1]);
                exit(64);
            }
        }
        else if (!strcmp(argv[i], "--grid")) {
            g_grid = atoi(argv[i + 1]);
            if (g_grid < 1) {
                fprintf(stderr, "bad --grid %s: blocks, at least 1\n", argv[i + 1]);
                exit(64);
            }
        } else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            exit(64);
        }
    }
}

static CUfunction g_spin;
static int g_khz;

/* load the driver and the spin kernel */
static void load_spin(void)
{
    load_driver();
    CHECK(p_cuDeviceGetAttribute(&g_khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, g_device));
    if (g_khz <= 0) g_khz = 1000000;
    if (!g_grid) CHECK(p_cuDeviceGetAttribute(&g_grid, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, g_device));
    if (g_grid < 1) g_grid = 1;
    CUmodule mod;
    CHECK(p_cuModuleLoadData(&mod, spin_ptx));
    CHECK(p_cuModuleGetFunction(&g_spin, mod, "spin"));
}

/* a spin kernel of function f and grid blocks, us long, on s (cycles: its parameter, which must
 * live until the launch returns) */
static CUresult spin_fn(CUfunction f, int grid, CUstream s, unsigned long long *cycles, double us)
{
    *cycles = (unsigned long long)(us * g_khz / 1000.0);
    void *params[] = {cycles};
    return p_cuLaunchKernel(f, (unsigned)grid, 1, 1, 1, 1, 1, 0, s, params, NULL);
}

static CUresult spin(CUstream s, unsigned long long *cycles, double us)
{
    return spin_fn(g_spin, g_grid, s, cycles, us);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)(p / 100.0 * n + 0.999999) - 1; /* nearest rank */
    return n ? v[i < 0 ? 0 : i] : 0;
}

/* ms between an event pair around one kernel, waited for */
static float time_one(void)
{
    static CUevent e0, e1;
    unsigned long long cycles;
    float ms;
    if (!e0) {
        CHECK(p_cuEventCreate(&e0, CU_EVENT_DEFAULT));
        CHECK(p_cuEventCreate(&e1, CU_EVENT_DEFAULT));
    }
    CHECK(p_cuEventRecord(e0, NULL));
    CHECK(spin(NULL, &cycles, g_kernel_us));
    CHECK(p_cuEventRecord(e1, NULL));
    CHECK(p_cuEventSynchronize(e1));
    CHECK(p_cuEventElapsedTime(&ms, e0, e1));
    return ms;
}

static int cmd_launch(int argc, char **argv)
{
    parse_opts(argc, argv);
    load_spin();
    unsigned long long cycles;
    float best = 1e9f; /* calibrate: GPU time of one kernel, the shortest of a few */
    for (int i = 0; i < 5; i++) {
        float ms = time_one();
        if (ms < best) best = ms;
    }
    /* an event after every --mark-every kernels (16): at the window's end, the newest one
     * complete tells how many kernels ran within the window (the rest were queued and run after
     * it), up to mark-every - 1 short. Not after every kernel by default: the simulated driver
     * timestamps 32 events in flight per process, and an unpaced process queues 1024 kernels;
     * paced processes queue a few, and several of them side by side each lose up to a batch */
    enum { EVENTS = 128 }; /* more than a driver queues (1024 kernels) */
    static CUevent ev[EVENTS];
    for (int i = 0; i < EVENTS; i++) CHECK(p_cuEventCreate(&ev[i], CU_EVENT_DEFAULT));
    CUstream st[64] = {NULL}; /* blocking streams: the legacy stream's events wait for them all */
    for (int i = 1; i < g_streams; i++) CHECK(p_cuStreamCreate(&st[i], 0));
    long long launches = 0, batches = 0, in_window = 0, warm = 0; /* warm: launches of the warm-up */
    int counting = 0;
    /* --window-at: several processes (a claim's) count over one window, not each over its own */
    double t0 = g_window_at > 0 ? g_window_at : now_s() + g_warmup, end = t0 + g_seconds;
    while (g_on_ms > 0 && now_s() < end) { /* bursty: on-ms of GPU work, waited for, then idle */
        long long n = (long long)(g_on_ms * 1e3 / g_kernel_us + 0.5), i;
        int counted = now_s() >= t0;
        for (i = 0; i < (n < 1 ? 1 : n) && now_s() < end; i++) CHECK(spin(st[i % g_streams], &cycles, g_kernel_us));
        CHECK(p_cuCtxSynchronize());
        launches += counted ? i : 0;
        in_window += counted ? i : 0;
        double idle = now_s() + g_off_ms / 1e3;
        while (now_s() < idle && now_s() < end) usleep(500);
    }
    while (g_on_ms <= 0 && now_s() < end) {
        if (!counting && now_s() >= t0) counting = 1, warm = launches; /* the warm-up's launches are not counted */
        for (int i = 0; i < g_mark_every; i++) CHECK(spin(st[(launches + i) % g_streams], &cycles, g_kernel_us));
        CHECK(p_cuEventRecord(ev[batches++ % EVENTS], NULL));
        launches += g_mark_every;
    }
    double window = now_s() - t0;
    for (long long b = batches - 1; b >= 0 && b >= batches - EVENTS && (b + 1) * g_mark_every > warm && !in_window; b--)
        if (p_cuEventQuery(ev[b % EVENTS]) == CUDA_SUCCESS) in_window = (b + 1) * g_mark_every - warm;
    launches -= warm;
    CHECK(p_cuCtxSynchronize());
    double wall = now_s() - t0;
    printf("launches=%lld seconds=%.3f launches_per_s=%.1f kernel_us=%.1f busy_share=%.2f grid=%d"
           " window_s=%.3f done_in_window=%lld\n", launches, wall, launches / wall, best * 1000.0,
           100.0 * launches * best / 1000.0 / wall, g_grid, window, in_window);
    return 0;
}

static int cmd_time(int argc, char **argv)
{
    parse_opts(argc, argv);
    load_spin();
    double *ms = calloc((size_t)g_count, sizeof *ms);
    for (int i = 0; i < g_count; i++) ms[i] = time_one();
    printf("count=%d median_ms=%.3f p90_ms=%.3f\n", g_count, pct(ms, g_count, 50), pct(ms, g_count, 90));
    return 0;
}

static int cmd_serve(int argc, char **argv)
{
    parse_opts(argc, argv);
    load_spin();
    unsigned long long cycles[64];
    int k = g_kernels < 1 ? 1 : g_kernels > 64 ? 64 : g_kernels;
    int cap = (int)(g_seconds * 1e6 / g_interval_us) + 2, n = 0;
    double *lat = calloc((size_t)cap, sizeof *lat);
    double t0 = now_s(), next = t0;
    while (n < cap && now_s() < t0 + g_seconds) {
        double t = now_s();
        if (t < next) {
            usleep((useconds_t)((next - t) * 1e6));
            t = now_s();
        }
        for (int i = 0; i < k; i++) CHECK(spin(NULL, &cycles[i], g_request_us / k));
        CHECK(p_cuCtxSynchronize());
        lat[n++] = (now_s() - t) * 1e3;
        next = now_s() + g_interval_us / 1e6; /* think time after each answer */
    }
    double wall = now_s() - t0;
    printf("requests=%d busy_share=%.2f", n, 100.0 * n * g_request_us / 1e6 / wall);
    printf(" p50_ms=%.3f p99_ms=%.3f\n", pct(lat, n, 50), pct(lat, n, 99));
    return 0;
}

static int cmd_graph(int argc, char **argv)
{
    parse_opts(argc, argv);
    load_spin();
    int mode = !strcmp(g_mode, "thread") ? 1 : !strcmp(g_mode, "relaxed") ? 2 : 0;
    int nodes = g_nodes < 1 ? 1 : g_nodes > 1024 ? 1024 : g_nodes;
    CUstream s, side;
    CHECK(p_cuStreamCreate(&s, 0));
    CHECK(p_cuStreamCreate(&side, 1 /* non-blocking */));
    CUevent ev;
    CHECK(p_cuEventCreate(&ev, CU_EVENT_DEFAULT));
    static unsigned long long cycles[1024], side_cycles;
    CHECK(p_cuStreamBeginCapture_v2(s, mode));
    CUresult rc = CUDA_SUCCESS;
    for (int i = 0; i < nodes && rc == CUDA_SUCCESS; i++) {
        rc = spin(s, &cycles[i], g_kernel_us);
        if (g_side_us > 0 && rc == CUDA_SUCCESS) {
            CHECK(spin(side, &side_cycles, g_side_us));
            usleep(2000);
        }
        if (g_record && i == nodes / 2 && rc == CUDA_SUCCESS) rc = p_cuEventRecord(ev, s);
    }
    CUgraph g = NULL;
    CUresult end = p_cuStreamEndCapture(s, &g);
    printf("capture_rc=%d capture=%s call_rc=%d\n", end, err_name(end), rc);
    if (rc || end) return 1;
    CUgraphExec ge;
    CHECK(p_cuGraphInstantiateWithFlags(&ge, g, 0));
    long long replays = 0;
    double t0 = now_s(), stop = t0 + g_seconds;
    while (now_s() < stop) {
        CHECK(p_cuGraphLaunch(ge, s));
        replays++;
    }
    CHECK(p_cuStreamSynchronize(s));
    double wall = now_s() - t0;
    printf("replays=%lld seconds=%.3f busy_share=%.2f\n", replays, wall,
           100.0 * replays * nodes * g_kernel_us / 1e6 / wall);
    return 0;
}


/* ---- replay: a framework-shaped step from a trace file (format at the top) ---- */
enum { OP_KERNEL, OP_HOST, OP_IDLE, OP_SYNC, OP_GRAPH };
enum { TRACE_STREAMS = 8, MAX_OPS = 1 << 16, MAX_GRAPHS = 16 };
struct trace_op {
    int kind, grid, stream, graph; /* graph: the kernel's graph (0: none; OP_GRAPH: which one) */
    int fn;                        /* a kernel's function: one per length and grid */
    double us, host_us;
};
static struct trace_op g_ops[MAX_OPS];
static int g_nops;

static void trace_error(int line, const char *what, const char *text)
{
    fprintf(stderr, "%s:%d: %s: %s\n", g_trace, line, what, text);
    exit(64);
}

static double trace_number(int line, const char *text, double lo, double hi)
{
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end || !(v >= lo && v <= hi)) {
        char what[96];
        snprintf(what, sizeof what, "want a number from %g to %g", lo, hi);
        trace_error(line, what, text);
    }
    return v;
}

/* parse g_trace into g_ops; returns the number of graphs */
static int load_trace(void)
{
    FILE *f = fopen(g_trace, "r");
    if (!f) {
        fprintf(stderr, "cannot read the trace %s: %m\n", g_trace);
        exit(66);
    }
    char buf[512];
    int line = 0, graphs = 0, in_graph = 0, syncs = 0, repeat_from = -1;
    long repeats = 0;
    while (fgets(buf, sizeof buf, f)) {
        line++;
        char *hash = strchr(buf, '#');
        if (hash) *hash = 0;
        char *tok[8];
        int n = 0;
        for (char *t = strtok(buf, " \t\r\n"); t && n < 8; t = strtok(NULL, " \t\r\n")) tok[n++] = t;
        if (!n) continue;
        struct trace_op op = {.grid = 0, .stream = 0};
        long times = 1;
        if (n > 1 && tok[n - 1][0] == 'x') times = (long)trace_number(line, tok[--n] + 1, 1, MAX_OPS);
        if (!strcmp(tok[0], "kernel") && n >= 2) {
            op.kind = OP_KERNEL;
            op.us = trace_number(line, tok[1], 0.5, 1e6);
            for (int i = 2; i < n; i++) {
                if (!strncmp(tok[i], "grid=", 5)) op.grid = (int)trace_number(line, tok[i] + 5, 1, 1 << 20);
                else if (!strncmp(tok[i], "stream=", 7)) op.stream = (int)trace_number(line, tok[i] + 7, 0, TRACE_STREAMS - 1);
                else if (!strncmp(tok[i], "host=", 5)) op.host_us = trace_number(line, tok[i] + 5, 0, 1e6);
                else trace_error(line, "unknown kernel field (grid=, stream=, host=)", tok[i]);
            }
            op.graph = in_graph;
        } else if ((!strcmp(tok[0], "host") || !strcmp(tok[0], "idle")) && n == 2) {
            op.kind = tok[0][0] == 'h' ? OP_HOST : OP_IDLE;
            op.us = trace_number(line, tok[1], 0, 1e7);
        } else if (!strcmp(tok[0], "sync") && n == 1) {
            op.kind = OP_SYNC;
            syncs++;
        } else if (!strcmp(tok[0], "graph") && n == 2 && !strcmp(tok[1], "begin") && !in_graph) {
            if (++graphs > MAX_GRAPHS) trace_error(line, "too many graphs", "16 at most");
            in_graph = graphs;
            op.kind = OP_GRAPH, op.graph = graphs;
        } else if (!strcmp(tok[0], "graph") && n == 2 && !strcmp(tok[1], "end") && in_graph) {
            in_graph = 0;
            continue;
        } else if (!strcmp(tok[0], "repeat") && n == 2 && repeat_from < 0 && !in_graph) {
            repeats = (long)trace_number(line, tok[1], 1, MAX_OPS);
            repeat_from = g_nops;
            continue;
        } else if (!strcmp(tok[0], "end") && n == 1 && repeat_from >= 0) {
            int len = g_nops - repeat_from;
            if ((long)len * repeats > MAX_OPS - repeat_from) trace_error(line, "too many ops", "65536 at most");
            for (long r = 1; r < repeats; r++, g_nops += len)
                memcpy(&g_ops[g_nops], &g_ops[repeat_from], (size_t)len * sizeof g_ops[0]);
            repeat_from = -1;
            continue;
        } else {
            trace_error(line, "not an op (kernel, host, idle, sync, graph begin|end, repeat N|end)", tok[0]);
        }
        if (in_graph && op.kind != OP_KERNEL && op.kind != OP_GRAPH)
            trace_error(line, "a graph holds kernels only", tok[0]);
        for (long i = 0; i < times; i++) {
            if (g_nops == MAX_OPS) trace_error(line, "too many ops", "65536 at most");
            g_ops[g_nops++] = op;
        }
    }
    fclose(f);
    if (in_graph) trace_error(line, "a graph is not ended", "graph begin without graph end");
    if (repeat_from >= 0) trace_error(line, "a repeat is not ended", "repeat without end");
    if (!syncs) trace_error(line, "the trace has no sync", "a step's end would be unknown");
    return graphs;
}

static void busy_us(double us)
{
    double until = now_s() + us / 1e6;
    while (now_s() < until) {
    }
}

static int cmd_replay(int argc, char **argv)
{
    parse_opts(argc, argv);
    if (!g_trace) {
        fprintf(stderr, "replay needs --trace FILE\n");
        return 64;
    }
    int graphs = load_trace();
    load_spin();
    static unsigned long long cycles[MAX_OPS];
    CUstream st[TRACE_STREAMS] = {NULL}, gs;
    for (int i = 1; i < TRACE_STREAMS; i++) CHECK(p_cuStreamCreate(&st[i], 0));
    CHECK(p_cuStreamCreate(&gs, 0));
    /* a kernel of another length or grid is another op (a GEMM, a norm): its own function, from
     * a module of its own (the same name in one module is one function), so that anything that
     * tells kernels apart by function and grid (the library's costs) sees them apart */
    enum { MAX_FNS = 128 };
    static CUfunction fns[MAX_FNS];
    static double fn_us[MAX_FNS];
    static int fn_grid[MAX_FNS], nfns;
    for (int i = 0; i < g_nops; i++) {
        struct trace_op *o = &g_ops[i];
        if (!o->grid) o->grid = g_grid;
        if (o->kind != OP_KERNEL) continue;
        for (o->fn = 0; o->fn < nfns && !(fn_us[o->fn] == o->us && fn_grid[o->fn] == o->grid); o->fn++) {
        }
        if (o->fn < nfns) continue;
        if (nfns == MAX_FNS) {
            fprintf(stderr, "%s: more than %d kinds of kernel (length and grid)\n", g_trace, MAX_FNS);
            return 64;
        }
        CUmodule mod;
        CHECK(p_cuModuleLoadData(&mod, spin_ptx));
        CHECK(p_cuModuleGetFunction(&fns[nfns], mod, "spin"));
        fn_us[nfns] = o->us, fn_grid[nfns++] = o->grid;
    }
    CUgraphExec ge[MAX_GRAPHS + 1] = {NULL};
    double step_gpu_us = 0;
    int last_sync = 0;
    for (int i = 0; i < g_nops; i++) {
        struct trace_op *o = &g_ops[i];
        if (o->kind == OP_KERNEL) step_gpu_us += o->us;
        if (o->kind == OP_SYNC) last_sync = i;
        if (o->kind != OP_GRAPH) continue;
        CHECK(p_cuStreamBeginCapture_v2(gs, CU_STREAM_CAPTURE_MODE_GLOBAL));
        for (int k = i + 1; k < g_nops && g_ops[k].graph == o->graph && g_ops[k].kind == OP_KERNEL; k++)
            CHECK(spin_fn(fns[g_ops[k].fn], g_ops[k].grid, gs, &cycles[k], g_ops[k].us));
        CUgraph g;
        CHECK(p_cuStreamEndCapture(gs, &g));
        CHECK(p_cuGraphInstantiateWithFlags(&ge[o->graph], g, 0));
    }
    int cap = 1 << 20, n = 0;
    double *lat = calloc((size_t)cap, sizeof *lat);
    double t0 = g_window_at > 0 ? g_window_at : now_s() + g_warmup, end = t0 + g_seconds;
    long long steps = 0;
    while (now_s() < end) {
        double start = now_s(), done = start;
        for (int i = 0; i < g_nops; i++) {
            struct trace_op *o = &g_ops[i];
            if (o->kind == OP_KERNEL && o->graph) continue; /* replayed by its graph */
            if (o->kind == OP_KERNEL) {
                if (o->host_us > 0) busy_us(o->host_us);
                CHECK(spin_fn(fns[o->fn], o->grid, st[o->stream], &cycles[i], o->us));
            } else if (o->kind == OP_GRAPH) {
                CHECK(p_cuGraphLaunch(ge[o->graph], gs));
            } else if (o->kind == OP_HOST) {
                busy_us(o->us);
            } else if (o->kind == OP_IDLE) {
                usleep((useconds_t)o->us);
            } else {
                CHECK(p_cuCtxSynchronize());
                if (i == last_sync) done = now_s();
            }
        }
        if (done >= t0 && done < end) {
            steps++;
            if (n < cap) lat[n++] = (done - start) * 1e3;
        }
    }
    CHECK(p_cuCtxSynchronize());
    printf("steps=%lld seconds=%.3f steps_per_s=%.2f step_gpu_ms=%.3f gpu_share=%.2f graphs=%d ops=%d kernel_kinds=%d"
           " step_p50_ms=%.3f step_p99_ms=%.3f\n", steps, g_seconds, steps / g_seconds, step_gpu_us / 1e3,
           100.0 * steps * step_gpu_us / 1e6 / g_seconds, graphs, g_nops, nfns, pct(lat, n, 50), pct(lat, n, 99));
    return 0;
}

static int run(int argc, char **argv, int i);
static int g_argc;
static char **g_argv;

static void *run_thread(void *arg)
{
    usleep(200000); /* the main thread is gone by then */
    exit(run(g_argc, g_argv, (int)(long)arg));
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int i = 1;
    if (i < argc && !strcmp(argv[i], "--main-exits")) {
        pthread_t t;
        g_argc = argc, g_argv = argv;
        printf("main_exits=%d\n", (int)getpid());
        if (pthread_create(&t, NULL, run_thread, (void *)(long)(i + 1)) != 0) return 70;
        pthread_exit(NULL);
    }
    return run(argc, argv, i);
}

static int run(int argc, char **argv, int i)
{
    if (i + 1 < argc && !strcmp(argv[i], "--device")) {
        g_device = atoi(argv[i + 1]);
        i += 2;
    }
    if (i < argc && !strcmp(argv[i], "alloc")) return cmd_alloc(argc - i - 1, argv + i + 1);
    if (i < argc && !strcmp(argv[i], "meminfo")) return cmd_meminfo();
    if (i < argc && !strcmp(argv[i], "gpus")) return cmd_gpus();
    if (i < argc && !strcmp(argv[i], "launch")) return cmd_launch(argc - i - 1, argv + i + 1);
    if (i < argc && !strcmp(argv[i], "time")) return cmd_time(argc - i - 1, argv + i + 1);
    if (i < argc && !strcmp(argv[i], "serve")) return cmd_serve(argc - i - 1, argv + i + 1);
    if (i < argc && !strcmp(argv[i], "graph")) return cmd_graph(argc - i - 1, argv + i + 1);
    if (i < argc && !strcmp(argv[i], "replay")) return cmd_replay(argc - i - 1, argv + i + 1);
    fprintf(stderr, "usage: gpushare-probe [--main-exits] [--device N] alloc --chunk BYTES [--max BYTES] [--hold S] [--api A]\n"
                    "       gpushare-probe [--device N] meminfo\n"
                    "       gpushare-probe gpus\n"
                    "       gpushare-probe [--device N] launch --seconds T [--kernel-us US] [--streams N] [--on-ms MS --off-ms MS]\n"
                    "           [--warmup S | --window-at CLOCK_MONOTONIC_S] [--mark-every K]\n"
                    "       gpushare-probe [--device N] time --count N [--kernel-us US]\n"
                    "       gpushare-probe [--device N] serve --seconds T [--interval-us US] [--request-us US] [--kernels K]\n"
                    "       gpushare-probe [--device N] graph --seconds T [--kernel-us US] [--nodes N] [--mode M]\n"
                    "       gpushare-probe [--device N] replay --trace FILE --seconds T [--warmup S | --window-at S]\n"
                    "       (launch, time, serve, graph: --grid BLOCKS, default the SM count)\n");
    return 64;
}
