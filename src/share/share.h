/* Copies of a connection across fork, exec and fd passing (docs/design.md,
 * "Copies of a connection"): the module's public side. */
#ifndef SV_SHARE_H
#define SV_SHARE_H

#include <stdint.h>

/* The module's start: the stream (and below it the upgrade) starts too,
 * and the helper runs the copies' work at each of its rounds. Once, before
 * any connection (again: nothing). */
void sv_share_init(void);

#endif
