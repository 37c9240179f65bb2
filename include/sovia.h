/* libsovia's public interface: what a program may ask about its own
 * connections.
 *
 * libsovia is an LD_PRELOAD module: a program normally does not know it is
 * there. A program that wants to know includes this header and builds with
 * `pkg-config --cflags --libs libsovia`; it does not link against
 * libsovia.so (that would load the module into every run). The calls below
 * look the module's functions up at run time instead, so the same binary
 * runs with or without libsovia preloaded; without it they answer that
 * nothing is accelerated.
 *
 * ABI. The functions the module exports carry the symbol version SOVIA_1.0
 * and are looked up by that version. struct sovia_conn_info begins with the
 * caller's size of it: a newer module fills only what an older program's
 * struct holds, and fields are only ever added at its end.
 */
#ifndef SOVIA_H
#define SOVIA_H

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SOVIA_API_VERSION "SOVIA_1.0"

/* What carries one direction of a connection. */
enum sovia_medium {
	SOVIA_MEDIUM_NONE = 0, /* not a connection libsovia manages (or no libsovia) */
	SOVIA_MEDIUM_TCP = 1,  /* the kernel's TCP socket */
	SOVIA_MEDIUM_RDMA = 2, /* libsovia's RDMA queue pair */
};

struct sovia_conn_info {
	uint32_t size;    /* in: sizeof(struct sovia_conn_info) as the program knows it */
	uint32_t managed; /* out: 1 when libsovia manages the connection on this fd */
	uint32_t is_client;        /* it made the connection (connect), else accepted it */
	uint32_t tx_medium;        /* enum sovia_medium: what our sending goes over now */
	uint32_t rx_medium;        /* enum sovia_medium: what our receiving comes over now */
	char state[16];            /* tcp, resolving, requested, switching, rdma, fallback,
				    * broken, detaching, detached, resuming (libsovia(7)) */
	char fallback[32];         /* why it stays on TCP: none, rejected, no-rdma-route, ... */
	uint64_t rdma_tx_bytes;    /* application bytes sent over RDMA */
	uint64_t rdma_rx_bytes;    /* application bytes received over RDMA */
	uint64_t tcp_tx_bytes;     /* application bytes sent over TCP */
	uint64_t tcp_rx_bytes;     /* application bytes received over TCP */
	uint64_t credit_stalls;    /* sends that waited for the peer's credits */
	uint64_t time_to_rdma_us;  /* from connect()/accept() to the first byte on RDMA (0: none) */
};

/* The module's own entry points (SOVIA_1.0). Programs call the wrappers
 * below, which find these at run time. */
typedef const char *(*sovia_version_fn)(void);
typedef int (*sovia_conn_info_fn)(int fd, struct sovia_conn_info *info);

#ifdef SOVIA_MODULE_BUILD
/* Inside libsovia.so: its definitions themselves (preload/api.c). */
const char *sovia_version(void);
int sovia_conn_info(int fd, struct sovia_conn_info *info);
#else
/* dlvsym, declared here so that a C program need not define _GNU_SOURCE
 * before its first include of <dlfcn.h> (g++ always defines it); in glibc's
 * libc since 2.34 (libdl before). NULL as the handle is RTLD_DEFAULT. */
#ifdef __cplusplus
#include <dlfcn.h>
#else
extern void *dlvsym(void *handle, const char *symbol, const char *version);
#endif

/* The module's function `name` into *fn (a function pointer), or NULL:
 * copied, since ISO C has no cast from an object to a function pointer. */
static inline void sovia__lookup(const char *name, void *fn, size_t size)
{
	void *sym = dlvsym((void *)0, name, SOVIA_API_VERSION);
	memcpy(fn, &sym, size);
}

/* libsovia's version ("0.1.0"), or NULL when it is not loaded. */
static inline const char *sovia_version(void)
{
	sovia_version_fn fn;
	sovia__lookup("sovia_version", &fn, sizeof(fn));
	return fn ? fn() : (const char *)0;
}

/* What libsovia knows of the connection on fd. Set info->size first.
 * 0: info is filled (managed 0 and both media NONE when libsovia is not
 * loaded or does not manage fd, state "" and fallback "none"); -1 with
 * errno EINVAL for a NULL info or a size below the first fields', EBADF
 * for an fd that is not open. */
static inline int sovia_conn_info(int fd, struct sovia_conn_info *info)
{
	if (!info || info->size < offsetof(struct sovia_conn_info, state)) {
		errno = EINVAL;
		return -1;
	}
	sovia_conn_info_fn fn;
	sovia__lookup("sovia_conn_info", &fn, sizeof(fn));
	if (fn)
		return fn(fd, info);
	if (fcntl(fd, F_GETFD) < 0)
		return -1; /* EBADF, as the module answers */
	uint32_t size = info->size < sizeof(*info) ? info->size : (uint32_t)sizeof(*info);
	memset((char *)info + sizeof(info->size), 0, size - sizeof(info->size));
	if (size >= offsetof(struct sovia_conn_info, fallback) + sizeof(info->fallback))
		strcpy(info->fallback, "none");
	return 0;
}

#endif /* SOVIA_MODULE_BUILD */

#ifdef __cplusplus
}
#endif

#endif
