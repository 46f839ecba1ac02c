/* Which C library is this process running, and where is its own dlsym?
 * Built without AddressSanitizer even in the ASan variant (hook/Makefile, NOSAN_SRC): sanitizer
 * start-up calls dlsym, and so gs_real_dlsym, before shadow memory exists. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <string.h>

#include "libc.h"
#include "log.h"

/* Weak: musl has no dlvsym, and a strong reference would stop musl's loader from loading us
 * at all ("Error relocating libgpushare.so: dlvsym: symbol not found", every program of an
 * Alpine container exiting 127). */
extern void *dlvsym(void *, const char *, const char *) __attribute__((weak));

gs_dlsym_fn gs_real_dlsym_p;

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

gs_dlsym_fn gs_find_real_dlsym(void)
{
    gs_dlsym_fn f;
    if (dlvsym) {
        /* glibc >= 2.34 exports dlsym from libc; older ones from libdl */
        f = (gs_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!f) f = (gs_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    } else {
        f = next_dlsym_by_symbol_table();
    }
    __atomic_store_n(&gs_real_dlsym_p, f, __ATOMIC_RELEASE);
    return f;
}

int gs_libc_is_glibc(void) { return dlvsym != NULL; }

/* Under a C library other than glibc (musl) the library passes every call through: the usage
 * region's mutexes are glibc's, so a musl process could not take part in the claim's shared
 * budget safely. The node's backstop still holds the claim's memory (docs/images.md). Said once
 * per process, at its first driver call, so programs that never touch the GPU print nothing. */
void gs_say_inactive(void)
{
    static int said;
    if (__atomic_exchange_n(&said, 1, __ATOMIC_ACQ_REL)) return;
    gs_log("the claim's library is not active in this program (its C library is not glibc): the node "
           "still holds the claim's memory limit; compute is not paced and memory queries show the whole GPU");
}
