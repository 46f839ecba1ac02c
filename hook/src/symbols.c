/* Where are the real driver functions, and which of our functions stands for a driver function?
 * Everything here is generated from the one list, hooked_symbols.def: the real_<name> pointers,
 * their resolution, and the table our dlsym and cuGetProcAddress look names and addresses up in.
 * The hooks are only named here (their addresses, declared by cuda_abi.h): this file calls none
 * of them and includes none of their files. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

#include "libc.h"
#include "symbols.h"

#define HOOKED(name, lib, base, since, ptsz) __typeof__(&name) real_##name;
#define CALLED(name, lib, older) __typeof__(&name) real_##name;
#include "hooked_symbols.def"
#undef HOOKED
#undef CALLED

struct symbol {
    const char *name;  /* exported (versioned) symbol */
    void *hook;        /* ours; NULL = a function we only call */
    void **real;
    int lib;
    const char *base;  /* cuGetProcAddress name, when it asks by base name */
    int min_version;   /* first CUDA version whose base name means this symbol */
    int ptsz;          /* per-thread default stream variant */
    const char *older; /* its name in older drivers; "" = none */
};

static const struct symbol symbols[] = {
#define HOOKED(name, lib, base, since, ptsz) {#name, (void *)name, (void **)&real_##name, GS_LIB_##lib, #base, since, ptsz, ""},
#define CALLED(name, lib, older) {#name, NULL, (void **)&real_##name, GS_LIB_##lib, "", 0, 0, #older},
#include "hooked_symbols.def"
#undef HOOKED
#undef CALLED
};
#define NSYMBOLS (sizeof symbols / sizeof symbols[0])

int gs_missing_cuda(void) { return CUDA_ERROR_NOT_INITIALIZED; }
int gs_missing_nvml(void) { return NVML_ERROR_LIBRARY_NOT_FOUND; }

void gs_resolve(int lib, const char *soname)
{
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    for (size_t i = 0; i < NSYMBOLS; i++) {
        const struct symbol *e = &symbols[i];
        if (e->lib != lib) continue;
        void *p = h ? gs_real_dlsym()(h, e->name) : NULL;
        if (!p && h && e->older[0]) p = gs_real_dlsym()(h, e->older);
        if (!p) p = lib == GS_LIB_CUDA ? (void *)gs_missing_cuda : (void *)gs_missing_nvml;
        __atomic_store_n(e->real, p, __ATOMIC_RELEASE);
    }
}

void *gs_substitute(const char *symbol, void *pfn, int version, cuuint64_t flags)
{
    for (size_t i = 0; i < NSYMBOLS; i++)
        if (symbols[i].hook && symbols[i].lib == GS_LIB_CUDA && *symbols[i].real == pfn) return symbols[i].hook;
    /* a driver may answer with an internal address: decide by name and version instead */
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0, has_ptsz = 0;
    for (size_t i = 0; i < NSYMBOLS; i++)
        if (symbols[i].hook && symbols[i].ptsz && strcmp(symbols[i].base, symbol) == 0) has_ptsz = 1;
    const struct symbol *best = NULL;
    for (size_t i = 0; i < NSYMBOLS; i++) {
        const struct symbol *e = &symbols[i];
        if (!e->hook || e->lib != GS_LIB_CUDA || strcmp(e->base, symbol) != 0) continue;
        if (e->ptsz != (want_ptsz && has_ptsz) || e->min_version > version) continue;
        if (!best || e->min_version > best->min_version) best = e;
    }
    return best ? best->hook : pfn;
}

/* The lookups below run inside our dlsym, so inside sanitizer start-up: uninstrumented. */

NO_SANITIZE static const struct symbol *find_hook(const char *name)
{
    for (size_t i = 0; i < NSYMBOLS; i++)
        if (symbols[i].hook && strcmp(symbols[i].name, name) == 0) return &symbols[i];
    return NULL;
}

NO_SANITIZE static int is_driver_object(const char *path, int lib)
{
    const char *b = path ? strrchr(path, '/') : NULL;
    b = b ? b + 1 : path;
    if (!b) return 0;
    return lib == GS_LIB_CUDA ? strncmp(b, "libcuda.so", 10) == 0 : strncmp(b, "libnvidia-ml.so", 15) == 0;
}

NO_SANITIZE void *gs_hooked_symbol(void *handle, const char *name)
{
    const struct symbol *e = find_hook(name);
    if (!e) return NULL;
    if (UNLIKELY(!gs_libc_is_glibc())) {
        gs_say_inactive(); /* the driver's own function, untouched */
        return NULL;
    }
    void *addr = gs_real_dlsym()(handle, name);
    if (!addr || addr == e->hook) return addr;
    Dl_info info;
    if (dladdr(addr, &info) && is_driver_object(info.dli_fname, e->lib)) return e->hook;
    return NULL;
}
