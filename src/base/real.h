/* The real libc entry points behind every interposed call, resolved once with
 * dlsym(RTLD_NEXT). SV_REAL_SYMBOLS is the one list of what we interpose: the
 * struct, the resolver and the version script's checks all derive from it. */
#ifndef SV_REAL_H
#define SV_REAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <spawn.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <wordexp.h>

#define SV_REAL_SYMBOLS(X)                                                                  \
	X(socket, int, (int, int, int))                                                     \
	X(bind, int, (int, const struct sockaddr *, socklen_t))                             \
	X(listen, int, (int, int))                                                          \
	X(accept, int, (int, struct sockaddr *, socklen_t *))                               \
	X(accept4, int, (int, struct sockaddr *, socklen_t *, int))                         \
	X(connect, int, (int, const struct sockaddr *, socklen_t))                          \
	X(read, ssize_t, (int, void *, size_t))                                             \
	X(write, ssize_t, (int, const void *, size_t))                                      \
	X(readv, ssize_t, (int, const struct iovec *, int))                                 \
	X(writev, ssize_t, (int, const struct iovec *, int))                                \
	X(recv, ssize_t, (int, void *, size_t, int))                                        \
	X(recvfrom, ssize_t, (int, void *, size_t, int, struct sockaddr *, socklen_t *))    \
	X(recvmsg, ssize_t, (int, struct msghdr *, int))                                    \
	X(send, ssize_t, (int, const void *, size_t, int))                                  \
	X(sendto, ssize_t, (int, const void *, size_t, int, const struct sockaddr *,        \
			    socklen_t))                                                     \
	X(sendmsg, ssize_t, (int, const struct msghdr *, int))                              \
	X(close, int, (int))                                                                \
	X(close_range, int, (unsigned int, unsigned int, int))                              \
	X(closefrom, void, (int))                                                           \
	X(shutdown, int, (int, int))                                                        \
	X(setsockopt, int, (int, int, int, const void *, socklen_t))                        \
	X(getsockopt, int, (int, int, int, void *, socklen_t *))                            \
	X(fdopen, FILE *, (int, const char *))                                              \
	X(fileno, int, (FILE *))                                                            \
	X(fileno_unlocked, int, (FILE *))                                                   \
	X(freopen, FILE *, (const char *, const char *, FILE *))                            \
	X(freopen64, FILE *, (const char *, const char *, FILE *))                          \
	X(poll, int, (struct pollfd *, nfds_t, int))                                        \
	X(ppoll, int, (struct pollfd *, nfds_t, const struct timespec *, const sigset_t *))  \
	X(select, int, (int, fd_set *, fd_set *, fd_set *, struct timeval *))               \
	X(pselect, int, (int, fd_set *, fd_set *, fd_set *, const struct timespec *,        \
			 const sigset_t *))                                                  \
	X(fork, pid_t, (void))                                                              \
	X(_exit, void, (int))                                                               \
	X(_Exit, void, (int))                                                               \
	X(execve, int, (const char *, char *const[], char *const[]))                        \
	X(execv, int, (const char *, char *const[]))                                        \
	X(execvp, int, (const char *, char *const[]))                                       \
	X(execvpe, int, (const char *, char *const[], char *const[]))                       \
	X(fexecve, int, (int, char *const[], char *const[]))                                \
	X(execveat, int, (int, const char *, char *const[], char *const[], int))             \
	X(posix_spawn, int, (pid_t *, const char *, const posix_spawn_file_actions_t *,     \
			     const posix_spawnattr_t *, char *const[], char *const[]))       \
	X(posix_spawnp, int, (pid_t *, const char *, const posix_spawn_file_actions_t *,    \
			      const posix_spawnattr_t *, char *const[], char *const[]))      \
	X(system, int, (const char *))                                                      \
	X(popen, FILE *, (const char *, const char *))                                      \
	X(wordexp, int, (const char *, wordexp_t *, int))                                   \
	X(daemon, int, (int, int))                                                          \
	X(forkpty, pid_t, (int *, char *, const struct termios *, const struct winsize *))  \
	X(dup, int, (int))                                                                  \
	X(dup2, int, (int, int))                                                            \
	X(dup3, int, (int, int, int))                                                       \
	X(fcntl, int, (int, int, ...))                                                      \
	X(fcntl64, int, (int, int, ...))                                                    \
	X(epoll_ctl, int, (int, int, int, struct epoll_event *))                            \
	X(epoll_wait, int, (int, struct epoll_event *, int, int))                           \
	X(epoll_pwait, int, (int, struct epoll_event *, int, int, const sigset_t *))        \
	X(epoll_pwait2, int, (int, struct epoll_event *, int, const struct timespec *,      \
			      const sigset_t *))                                             \
	X(sendfile, ssize_t, (int, int, off_t *, size_t))                                   \
	X(sendfile64, ssize_t, (int, int, off_t *, size_t))                                 \
	X(splice, ssize_t, (int, loff_t *, int, loff_t *, size_t, unsigned int))            \
	X(ioctl, int, (int, unsigned long, ...))                                            \
	X(recvmmsg, int, (int, struct mmsghdr *, unsigned int, int, struct timespec *))     \
	X(sendmmsg, int, (int, struct mmsghdr *, unsigned int, int))                        \
	X(setuid, int, (uid_t))                                                             \
	X(setgid, int, (gid_t))                                                             \
	X(seteuid, int, (uid_t))                                                            \
	X(setegid, int, (gid_t))                                                            \
	X(setreuid, int, (uid_t, uid_t))                                                    \
	X(setregid, int, (gid_t, gid_t))                                                    \
	X(setresuid, int, (uid_t, uid_t, uid_t))                                            \
	X(setresgid, int, (gid_t, gid_t, gid_t))                                            \
	X(setgroups, int, (size_t, const gid_t *))                                          \
	X(initgroups, int, (const char *, gid_t))                                           \
	X(setfsuid, int, (uid_t))                                                           \
	X(setfsgid, int, (gid_t))                                                           \
	X(syscall, long, (long, ...))

struct sv_real {
#define SV_REAL_FIELD(name, ret, args) ret(*name) args;
	SV_REAL_SYMBOLS(SV_REAL_FIELD)
#undef SV_REAL_FIELD
};

extern struct sv_real sv_real;
extern atomic_bool sv_real_ready;

/* Resolve every symbol (once; thread-safe). Aborts with a message if one is
 * missing or resolves back into libsovia itself. */
void sv_real_resolve(void);

/* The real function, resolving on first use (calls can arrive before our
 * constructor has run, from other libraries' constructors). */
#define SV_REAL(name)                                                                       \
	(atomic_load_explicit(&sv_real_ready, memory_order_acquire) ? sv_real.name          \
								    : (sv_real_resolve(), sv_real.name))

/* libc's own stdin, stdout or stderr variable (fd 0, 1, 2): not the
 * executable's copy of it, where the executable has one (a copy
 * relocation, which every caller outside libc then uses). NULL when it
 * cannot be found. */
FILE **sv_real_std(int fd);

/* libc's syscall(2), for libsovia's own system calls (futexes, getdents,
 * capget, its log's writes): never the one it exports itself (io_uring's
 * set-up, uring.c). Usable before the table is resolved, and while it is
 * being resolved (a failure to resolve is logged through it). */
long (*sv_real_syscall(void))(long, ...);

#endif
