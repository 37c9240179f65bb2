/* Shared by the echo examples (sovia-echo-epoll, sovia-echo-fork,
 * sovia-execcat): the byte stream a client sends, the check a server runs
 * on it, and a client that sends one stream and checks its echo. Plain
 * socket code: nothing here knows about libsovia.
 *
 * The stream: a 16-byte header ("SVE1", the seed as 4 bytes and the
 * payload length as 8, little-endian), then the payload, a pseudo-random
 * pattern that depends only on the seed and the offset. The receiver of a
 * stream can so check every byte without having seen anything before, and
 * the client checks the echo against what it sent. */
#ifndef SOVIA_ECHO_COMMON_H
#define SOVIA_ECHO_COMMON_H

#include <stddef.h>
#include <stdint.h>

#define ECHO_HDR 16

/* The stream one client sends. */
struct echo_stream {
	uint32_t seed;
	uint64_t len; /* payload bytes, after the header */
	/* A client sends its first 64 KiB, then waits until this file exists
	 * before it sends the rest (NULL: it never waits). */
	const char *go;
};

/* Total bytes of the stream, header included. */
uint64_t echo_total(const struct echo_stream *s);

/* Fills buf with bytes [off, off + n) of the stream. */
void echo_fill(const struct echo_stream *s, uint64_t off, uint8_t *buf, size_t n);

/* Index of the first byte of buf that differs from bytes [off, off + n) of
 * the stream, or n if all match. */
size_t echo_diff(const struct echo_stream *s, uint64_t off, const uint8_t *buf, size_t n);

/* A receiver's check of a stream it does not know in advance: it learns
 * the seed and the length from the header. */
struct echo_check {
	uint8_t hdr[ECHO_HDR];
	struct echo_stream s;
	uint64_t got; /* stream bytes seen, header included */
	int bad;      /* set once a byte or the header was wrong */
};

void echo_check_init(struct echo_check *c);
/* Feeds n received bytes; returns -1 (once, with a message on stderr
 * prefixed by who) at the first wrong byte, else 0. */
int echo_check_feed(struct echo_check *c, const uint8_t *buf, size_t n, const char *who);
/* At end of stream: 0 if the whole stream arrived and was right. */
int echo_check_end(const struct echo_check *c, const char *who);

/* Connects to host:port (blocking connect; the socket then goes
 * non-blocking and poll() drives both directions, so a peer that echoes
 * before it has read everything never deadlocks with us), sends the
 * stream (pausing after its first chunk until s->go exists, if set),
 * shuts down writing, and reads the echo until EOF, checking every byte.
 * Returns 0 if the echo was the stream, exactly. */
int echo_poll_client(const char *who, const char *host, const char *port,
                     const struct echo_stream *s);

/* A listening TCP socket on all IPv4 addresses. Exits on failure. */
int echo_listen(const char *who, int port, int backlog);

/* A forking server's end: wait for `conns` children; each must exit 0
 * (`what` names them in the message). Prints "OK <conns> connections" and
 * returns 0, or 1 when one failed. */
int echo_reap(const char *who, int conns, const char *what);

/* main() of a forking server: `-s [-S] PORT CONNS` accepts CONNS
 * connections on PORT and forks for each; the child closes the listener and
 * exits with child(fd). With -S the parent waits for SIGUSR1 after each
 * accept, before the fork. It then reaps the children (`what` names them).
 * `-p WORKERS PORT CONNS` preforks WORKERS children that accept CONNS
 * connections in all on the listening socket they inherited, each served
 * by child(fd) in the worker. `-c HOST PORT BYTES SEED` runs a checking
 * client. */
int echo_fork_main(const char *who, int argc, char **argv, int (*child)(int fd),
		   const char *what);

/* Exits with status 2 after printing who: what: strerror(errno). */
_Noreturn void echo_die(const char *who, const char *what);

#endif
