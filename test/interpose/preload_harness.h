/* The interposer's tests: the wrappers of preload/ are linked into the test
 * program itself, so that its own socket calls go through them as a
 * preloaded program's do, over the fake RDMA network (fake_net.h) and real
 * loopback TCP. The stream harness (harness.h) gives the settings, the
 * patterns and the checks. */
#ifndef SV_TEST_PRELOAD_HARNESS_H
#define SV_TEST_PRELOAD_HARNESS_H

#include "harness.h"

#include <sys/types.h>

/* The stream libsovia keeps for the application's fd (borrowed: it lives
 * while the fd is open), or NULL when the fd is not one. */
struct sv_stream *ph_stream(int fd);
/* The name of fd's operations (NULL: the kernel's, unmanaged). */
const char *ph_ops_name(int fd);

/* A connection made with the application's calls (socket, listen, connect,
 * accept: the interposer makes both ends streams), both ends on RDMA. p->c
 * and p->s stay valid until the test ends. */
void ph_pair_rdma(struct pair *p);
/* Close what the test left open of it (through close()). */
void ph_pair_close(struct pair *p);

/* A fork as the interposed fork() makes it, except that only fd's
 * connection is taken back to TCP (or kept) for it: here the test holds
 * the other end too, which is another process's in real use (whose own
 * fork would take it back as well). */
pid_t ph_fork_one(int fd);

/* Write all of buf with write(); read n bytes with read() (until EOF or an
 * error: the bytes read). */
long ph_write_all(int fd, const void *buf, size_t n);
size_t ph_read_all(int fd, void *buf, size_t n);

#endif
