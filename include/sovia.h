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
 * struct holds, an older module only what it knows, and the size it writes
 * back says which; fields are only ever added at the end. C99 and later,
 * C++11 and later.
 */
#ifndef SOVIA_H
#define SOVIA_H

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

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
	uint32_t size;    /* in: sizeof(struct sovia_conn_info) as the program knows it;
			   * out: the bytes the answer filled */
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

/* The size of the first version's struct: the least a caller may pass. A
 * later version only adds fields after time_to_rdma_us. */
#define SOVIA_CONN_INFO_SIZE_1 \
	(offsetof(struct sovia_conn_info, time_to_rdma_us) + sizeof(uint64_t))

/* The module's own entry points (SOVIA_1.0). Programs call the wrappers
 * below, which find these at run time. */
typedef const char *(*sovia_version_fn)(void);
typedef int (*sovia_conn_info_fn)(int fd, struct sovia_conn_info *info);

#ifdef SOVIA_MODULE_BUILD
/* Inside libsovia.so: its definitions themselves (preload/api.c). */
const char *sovia_version(void);
int sovia_conn_info(int fd, struct sovia_conn_info *info);
#else
/* dlvsym: glibc's <dlfcn.h> declares it under _GNU_SOURCE (__USE_GNU, as
 * glibc's headers say it; g++ always defines it); otherwise it is declared
 * here, so that a C program need not define _GNU_SOURCE for this header
 * (libsovia is for glibc on Linux). In glibc's libc since 2.34 (libdl
 * before). A NULL handle is RTLD_DEFAULT. */
#include <dlfcn.h>
#if !defined(__cplusplus) && !defined(__USE_GNU)
extern void *dlvsym(void *handle, const char *symbol, const char *version);
#endif

/* A null pointer and a cast to bytes, in C++11's words where C++ is built
 * (clang++ -Wzero-as-null-pointer-constant, -Wold-style-cast), else C's. */
#ifdef __cplusplus
#define SOVIA_NULL_ nullptr
#define SOVIA_BYTES_(p) reinterpret_cast<char *>(p)
#else
#define SOVIA_NULL_ ((void *)0)
#define SOVIA_BYTES_(p) ((char *)(p))
#endif

/* The module's function `name` into *fn (a function pointer), or NULL:
 * copied, since ISO C has no cast from an object to a function pointer. */
static inline void sovia_lookup_(const char *name, void *fn, size_t size)
{
	void *sym = dlvsym(SOVIA_NULL_, name, SOVIA_API_VERSION);
	memcpy(fn, &sym, size);
}

/* libsovia's version ("0.1.0"), or NULL when it is not loaded. */
static inline const char *sovia_version(void)
{
	sovia_version_fn fn;
	sovia_lookup_("sovia_version", &fn, sizeof(fn));
	return fn ? fn() : SOVIA_NULL_;
}

/* SO_PROTOCOL, which glibc's <sys/socket.h> hides under a strict
 * -std=c99: the kernel's header has it for every architecture. */
#ifndef SO_PROTOCOL
#include <asm/socket.h>
#endif

/* fd is a TCP socket (the kernel's TCP carries it). */
static inline int sovia_is_tcp_(int fd)
{
	int type = 0, proto = 0;
	socklen_t tl = sizeof(type), pl = sizeof(proto);
	return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0 && type == SOCK_STREAM &&
	       getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &pl) == 0 &&
	       proto == IPPROTO_TCP;
}

/* What libsovia knows of the connection on fd. Set info->size first; on
 * return it says how much was filled. 0: info is filled; without libsovia,
 * or for an fd libsovia does not serve, managed is 0, both media are TCP
 * for a TCP socket (the kernel's) and NONE for anything else, state is ""
 * and fallback "none". -1 with errno: EINVAL for a NULL info or a size
 * below SOVIA_CONN_INFO_SIZE_1, EBADF for an fd that is not open, EBUSY
 * from a signal handler that interrupted libsovia on that connection. */
static inline int sovia_conn_info(int fd, struct sovia_conn_info *info)
{
	sovia_conn_info_fn fn;
	uint32_t n;
	int saved = errno;
	if (!info || info->size < SOVIA_CONN_INFO_SIZE_1) {
		errno = EINVAL;
		return -1;
	}
	sovia_lookup_("sovia_conn_info", &fn, sizeof(fn));
	if (fn)
		return fn(fd, info);
	if (fcntl(fd, F_GETFD) < 0)
		return -1; /* EBADF, as the module answers */
	/* As the module: no more than the caller's size says, and that
	 * size back. */
	n = sizeof(*info);
	if (info->size < n)
		n = info->size;
	memset(SOVIA_BYTES_(info) + offsetof(struct sovia_conn_info, managed), 0,
	       n - offsetof(struct sovia_conn_info, managed));
	info->size = n;
	strcpy(info->fallback, "none");
	if (sovia_is_tcp_(fd))
		info->tx_medium = info->rx_medium = SOVIA_MEDIUM_TCP;
	errno = saved;
	return 0;
}

#endif /* SOVIA_MODULE_BUILD */

#ifdef __cplusplus
}
#endif

#endif
