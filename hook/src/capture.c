/* Is a stream capturing into a graph? Captures begun through us are counted, so that the
 * launch path (pacing.c) asks the driver about capture only while one is active; stream-ordered
 * allocations on a capturing stream are refused (memory.c). An ended capture (invalidated or
 * not) is no longer active. Hooks: cuStreamBeginCapture(_v2)(_ptsz), cuStreamEndCapture(_ptsz). */
#include "capture.h"
#include "init.h"
#include "symbols.h"

int g_captures;

int capturing(CUstream s, int ptsz)
{
    __typeof__(real_cuStreamIsCapturing) fn = ptsz ? real_cuStreamIsCapturing_ptsz : real_cuStreamIsCapturing;
    if ((void *)fn == (void *)gs_missing_cuda) return 0; /* a driver without capture */
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    return fn(s, &st) != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_NONE;
}

static CUresult capture_begun(CUresult rc)
{
    if (rc == CUDA_SUCCESS) __atomic_add_fetch(&g_captures, 1, __ATOMIC_RELAXED);
    return rc;
}

static CUresult capture_ended(CUresult rc)
{
    int n = __atomic_load_n(&g_captures, __ATOMIC_RELAXED);
    if (rc == CUDA_SUCCESS || rc == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
        while (n > 0 && !__atomic_compare_exchange_n(&g_captures, &n, n - 1, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return rc;
}

HOOK CUresult cuStreamBeginCapture(CUstream s) { ensure_cuda(); return capture_begun(real_cuStreamBeginCapture(s)); }
HOOK CUresult cuStreamBeginCapture_ptsz(CUstream s)
{
    ensure_cuda();
    return capture_begun(real_cuStreamBeginCapture_ptsz(s));
}
HOOK CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode m)
{
    ensure_cuda();
    return capture_begun(real_cuStreamBeginCapture_v2(s, m));
}
HOOK CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode m)
{
    ensure_cuda();
    return capture_begun(real_cuStreamBeginCapture_v2_ptsz(s, m));
}
HOOK CUresult cuStreamEndCapture(CUstream s, CUgraph *g) { ensure_cuda(); return capture_ended(real_cuStreamEndCapture(s, g)); }
HOOK CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g)
{
    ensure_cuda();
    return capture_ended(real_cuStreamEndCapture_ptsz(s, g));
}
