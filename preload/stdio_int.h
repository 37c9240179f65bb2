/* Between stdio.c (the cookie FILEs) and stdio_std.c (stdin, stdout and
 * stderr made cookie FILEs). */
#ifndef SV_STDIO_INT_H
#define SV_STDIO_INT_H

#include <stdio.h>

/* A FILE on fd whose calls come back through read, write and close,
 * listed for fileno(); NULL with errno set. */
FILE *sv_cookie_open(int fd, const char *mode);
/* fp's cookie now reads, writes and closes fd (-1: none, every call
 * fails with EBADF). */
void sv_cookie_set_fd(FILE *fp, int fd);
/* The cookie FILE fp is being closed (stdio_std.c forgets it). */
void sv_stdio_std_closing(FILE *fp);

#endif
