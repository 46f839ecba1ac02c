/* Where is cuGetProcAddress handled? The CUDA runtime (12.x) finds every driver function through
 * it: we call the real one, then replace its answer with our hook when it is the address of a
 * function we hook (symbols.c, gs_substitute), so the driver's own choice of _v2/_v3/_ptsz for
 * the CUDA version and flags decides which hook. */
#include "init.h"
#include "symbols.h"

HOOK CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult *status)
{
    ensure_cuda();
    CUresult rc = real_cuGetProcAddress_v2(symbol, pfn, version, flags, status);
    if (rc == CUDA_SUCCESS && symbol && pfn && *pfn) *pfn = gs_substitute(symbol, *pfn, version, flags);
    return rc;
}

HOOK CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    ensure_cuda();
    CUresult rc = real_cuGetProcAddress(symbol, pfn, version, flags);
    if (rc == CUDA_SUCCESS && symbol && pfn && *pfn) *pfn = gs_substitute(symbol, *pfn, version, flags);
    return rc;
}
