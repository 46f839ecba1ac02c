/* Built with musl-gcc by tests/hook/test_baseline.py and run with libgpushare.so preloaded
 * under musl's loader: the library loads, its dlsym behaves as musl's own (RTLD_DEFAULT,
 * RTLD_NEXT, library handles), and the driver's functions come back untouched. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

__attribute__((visibility("default"))) int t_musl_marker(void) { return 42; }

#define CHECK(c)                                                   \
    do {                                                           \
        if (!(c)) {                                                \
            printf("FAIL %s:%d %s\n", __FILE__, __LINE__, #c);     \
            return 1;                                              \
        }                                                          \
    } while (0)

int main(void)
{
    CHECK(dlsym(RTLD_DEFAULT, "strlen") == (void *)strlen);
    CHECK(dlsym(RTLD_NEXT, "strlen") == (void *)strlen); /* the object after us defining it: libc */
    CHECK(dlsym(RTLD_DEFAULT, "t_musl_marker") == (void *)t_musl_marker);
    CHECK(dlsym(RTLD_DEFAULT, "no_such_symbol_anywhere") == NULL);
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL);
    void *alloc = dlsym(h, "cuMemAlloc_v2");
    Dl_info info;
    CHECK(alloc && dladdr(alloc, &info) && strstr(info.dli_fname, "libcuda.so"));
    printf("OK t_musl\n");
    return 0;
}
