/* Where are the real driver functions, and which of our functions stands for a driver function?
 * The bottom of the library: it knows the list of names (hooked_symbols.def) and nothing of what
 * the hooks do. Everything else calls the driver through the real_<name> pointers declared here. */
#ifndef GPUSHARE_SYMBOLS_H
#define GPUSHARE_SYMBOLS_H

#include "compiler.h"
#include "cuda_abi.h"

enum { GS_LIB_CUDA, GS_LIB_NVML };

/* real_<name> for every line of hooked_symbols.def; NULL until gs_resolve(lib), then the
 * driver's function or a stand-in that answers "no driver" (gs_missing_cuda / _nvml) */
#define HOOKED(name, lib, base, since, ptsz) extern __typeof__(&name) real_##name GS_HIDDEN;
#define CALLED(name, lib, older) extern __typeof__(&name) real_##name GS_HIDDEN;
#include "hooked_symbols.def"
#undef HOOKED
#undef CALLED

/* What a missing real function does: the driver is absent or too old for that entry point.
 * Called through the hooked prototypes; every one returns an int status in rax. */
int gs_missing_cuda(void) GS_HIDDEN;
int gs_missing_nvml(void) GS_HIDDEN;

/* Fill every real_<name> of lib from our own dlopen(soname, RTLD_LOCAL) handle and the C
 * library's dlsym (never through ourselves). */
void gs_resolve(int lib, const char *soname) GS_HIDDEN;

/* cuGetProcAddress answered pfn for (symbol, version, flags): our hook instead, if pfn is a
 * function we hook; else pfn */
void *gs_substitute(const char *symbol, void *pfn, int version, cuuint64_t flags) GS_HIDDEN;

/* dlsym(handle, name): our hook if name is hooked and the real lookup lands in the driver (or
 * already in us); else NULL. Nothing is initialised here. */
void *gs_hooked_symbol(void *handle, const char *name) GS_HIDDEN;

#endif
