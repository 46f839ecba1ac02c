/* Our dlsym: applications that dlopen the driver and look its functions up (the CUDA
 * runtime, PyTorch, pynvml) get our hooks. Kept in its own file, built without
 * AddressSanitizer even in the ASan variant: sanitizer start-up calls dlsym before shadow
 * memory exists, and ASan instrumentation would prevent the tail call below. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <string.h>

#include "dlsym.h"

/* Weak: musl has no dlvsym, and a strong reference would stop musl's loader from loading us
 * at all ("Error relocating libgpushare.so: dlvsym: symbol not found", every program of an
 * Alpine container exiting 127). */
extern void *dlvsym(void *, const char *, const char *) __attribute__((weak));

static gs_dlsym_fn real_dlsym_p;

/* The first object loaded after `self` that defines `name`: RTLD_NEXT without dlsym, read from
 * the objects' own symbol tables (DT_HASH gives their size). Only for C libraries without
 * dlvsym (musl), where the dlsym any call reaches is ours. */
struct next_lookup {
    const char *name;
    uintptr_t self;
    int after_self;
    void *found;
};

static int lookup_in_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct next_lookup *q = data;
    if (!q->after_self) {
        q->after_self = info->dlpi_addr == q->self;
        return 0;
    }
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) dyn = (const void *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (!dyn) return 0;
    const ElfW(Sym) *syms = NULL;
    const char *strs = NULL;
    const uint32_t *hash = NULL;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        uintptr_t p = dyn->d_un.d_ptr;
        if (p < info->dlpi_addr) p += info->dlpi_addr; /* musl leaves them unrelocated, glibc not */
        if (dyn->d_tag == DT_SYMTAB) syms = (const void *)p;
        else if (dyn->d_tag == DT_STRTAB) strs = (const void *)p;
        else if (dyn->d_tag == DT_HASH) hash = (const void *)p;
    }
    if (!syms || !strs || !hash) return 0;
    for (uint32_t i = 0; i < hash[1]; i++) { /* hash[1]: the number of symbols */
        const ElfW(Sym) *s = &syms[i];
        if (s->st_shndx != SHN_UNDEF && ELF64_ST_TYPE(s->st_info) == STT_FUNC &&
            strcmp(strs + s->st_name, q->name) == 0) {
            q->found = (void *)(info->dlpi_addr + s->st_value);
            return 1;
        }
    }
    return 0;
}

static gs_dlsym_fn next_dlsym_by_symbol_table(void)
{
    Dl_info self;
    if (!dladdr((void *)&next_dlsym_by_symbol_table, &self)) return NULL;
    struct next_lookup q = {"dlsym", (uintptr_t)self.dli_fbase, 0, NULL};
    dl_iterate_phdr(lookup_in_object, &q);
    return (gs_dlsym_fn)q.found;
}

gs_dlsym_fn gs_real_dlsym(void)
{
    gs_dlsym_fn f = __atomic_load_n(&real_dlsym_p, __ATOMIC_ACQUIRE);
    if (__builtin_expect(!f, 0)) {
        if (dlvsym) {
            /* glibc >= 2.34 exports dlsym from libc; older ones from libdl */
            f = (gs_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
            if (!f) f = (gs_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        } else {
            f = next_dlsym_by_symbol_table();
        }
        __atomic_store_n(&real_dlsym_p, f, __ATOMIC_RELEASE);
    }
    return f;
}

int gs_libc_is_glibc(void) { return dlvsym != NULL; }

__attribute__((visibility("default"))) void *dlsym(void *handle, const char *name)
{
    /* every process calls this: two character compares unless the name is cu* or nv* */
    if ((name[0] == 'c' && name[1] == 'u') || (name[0] == 'n' && name[1] == 'v')) {
        void *h = gs_hooked_symbol(handle, name);
        if (h) return h;
    }
    /* a tail call (checked by the tests), so RTLD_NEXT still means "after the caller" */
    return gs_real_dlsym()(handle, name);
}
