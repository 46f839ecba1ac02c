#ifndef GPUSHARE_LOG_H
#define GPUSHARE_LOG_H
/* One line on stderr, prefixed "gpushare: ". Only used on init and error paths. */
void gs_log(const char *fmt, ...) __attribute__((format(printf, 1, 2), visibility("hidden")));
#endif
