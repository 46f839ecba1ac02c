#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void gs_log(const char *fmt, ...)
{
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "gpushare: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, sizeof buf - n - 1, fmt, ap);
    va_end(ap);
    size_t len = strlen(buf);
    buf[len++] = '\n';
    /* one write(2), so lines of concurrent processes do not interleave */
    ssize_t rc = write(2, buf, len);
    (void)rc;
}
