/* Shared by the interposer's files: initialisation state, the re-entry
 * guard, and the -errno to -1/errno conversion at the boundary. */
#ifndef SV_PRELOAD_H
#define SV_PRELOAD_H

#include "fdtable.h"
#include "guard.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>

#define SV_EXPORT __attribute__((visibility("default")))

extern atomic_bool sv_initialised;

static inline bool sv_passthrough(void)
{
	return !atomic_load_explicit(&sv_initialised, memory_order_acquire) || sv_tls_inside;
}

/* ---- Calls from inside libsovia (reentry.c) --------------------------------
 *
 * A call that reaches a wrapper while its thread is inside libsovia comes
 * from a library libsovia called, on that library's own fds, or from a
 * signal handler that interrupted the thread in libsovia's code: it then
 * takes no lock and touches nothing of libsovia's (the thread may hold
 * any of it). On an fd libsovia has nothing of it goes to the kernel; on
 * one it serves it is refused (sv_refuse). */
static inline bool sv_reentered(void)
{
	return sv_tls_inside && atomic_load_explicit(&sv_initialised, memory_order_acquire);
}

/* Does fd have anything of libsovia's that a call from inside cannot use
 * (fdtable.h's marks)? */
static inline bool sv_fd_claimed(int fd, unsigned marks)
{
	return (sv_fd_marks(fd) & marks) != 0;
}
#define SV_CLAIM_ANY (SV_MARK_SERVED | SV_MARK_EPOLL | SV_MARK_MANAGED)

/* fd's entry for one of the application's calls (a reference), or NULL
 * when the call goes straight to libc: libsovia not set up, fd not
 * managed, or a call from inside on an fd libsovia does not serve. From
 * inside on one it serves: NULL with *refused set. */
struct sv_fd *sv_fd_for_call(int fd, bool *refused);
/* Refuse `call` on fd from inside libsovia: errno = err (EAGAIN for the
 * calls that move bytes, EBUSY for the others), -1. The first refusal of
 * each kind says why on stderr. */
int sv_refuse(int fd, const char *call, int err);

/* Convert an internal result (>= 0 or -errno) to the libc convention. On
 * success errno is restored to what the caller had. */
static inline long sv_ret(long r, int saved_errno)
{
	if (r < 0) {
		errno = (int)-r;
		return -1;
	}
	errno = saved_errno;
	return r;
}

/* fd's connection goes back to plain TCP (if libsovia serves it), and its
 * entry becomes the kernel's (unserved.c). */
void sv_fd_detach(int fd, const char *call);
/* The same for every fd msg passes to another process (SCM_RIGHTS): the
 * receiver gets the kernel's socket, which must then be the whole
 * connection (unserved.c). Keeps errno. False, with nothing done, when the
 * call comes from inside libsovia and passes a connection libsovia
 * serves: the call is to be refused. */
struct msghdr;
bool sv_fd_detach_passed(const struct msghdr *msg);
/* Every accelerated connection (only those without FD_CLOEXEC when
 * `surviving_exec`) goes back to plain TCP (unserved.c). */
void sv_fd_detach_all(bool surviving_exec, const char *call);
/* Before a fork: the same for every one, but a server connection whose
 * upgrade has not begun is handed to the child instead (unserved.c). */
void sv_fd_detach_all_for_fork(void);
/* After the interposed fork, in the child (pid 0, after the fork handlers:
 * it takes the connections handed to it) or in the parent of a fork that
 * failed (pid -1: it keeps them). held.c. */
void sv_ops_after_fork(pid_t pid);

/* exec (exec_hand.c). Before it: the connections handed to this process
 * that the exec keeps are handed on to the new image in ex->envp (NULL:
 * none, pass the caller's); every other one it keeps goes back to plain
 * TCP. sv_exec_env_done after an exec that failed. */
struct sv_exec_env {
	char **envp;
	char *var, *client_var;
	int table_fd;
};
void sv_exec_prepare(const char *call, char *const envp[], struct sv_exec_env *ex);
void sv_exec_env_done(struct sv_exec_env *ex);
/* In the new image's constructor: continue what the image before handed on. */
void sv_exec_inherit(void);

/* At exit, before the connections end: the FILEs made on them write what
 * they buffered (stdio.c). */
void sv_stdio_exit_flush(void);

/* In a fork child: the FILEs fdopen made stay known (stdio.c). */
void sv_stdio_atfork_child(void);
/* When std fd 0, 1 or 2 carries a connection (the constructor of an
 * image exec'd on a handed one; a dup2 of a stream there): stdin, stdout
 * or stderr becomes a FILE whose calls come through the interposer, in
 * libsovia's variable and in libc's own (stdio_std.c). Not from a signal
 * handler (it allocates). 0 (also when already taken), -EBUSY
 * when something already used or replaced glibc's FILE (it stays), or
 * another -errno. */
int sv_stdio_take_std(int fd);
/* Is fd's std FILE (0-2) one sv_stdio_take_std made, still open? */
bool sv_stdio_ours(int fd);

/* One-time set-up: resolve symbols, load settings, size the fd table. */
void sv_preload_init(void);

#endif
