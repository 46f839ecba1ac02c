/* Is a stream capturing into a graph? (capture.c) */
#ifndef GPUSHARE_CAPTURE_H
#define GPUSHARE_CAPTURE_H

#include "compiler.h"
#include "cuda_abi.h"

/* captures begun through us and not yet ended: > 0 means ask the driver (capturing) */
extern int g_captures GS_HIDDEN;

/* 1 if stream s is capturing, or the driver says it may not be used now (the legacy stream
 * while a blocking stream captures): pacing never touches it, and memory allocated on it would
 * be graph memory */
int capturing(CUstream s, int ptsz) GS_HIDDEN;

#endif
