/* Calls that give a connection to another process or image. A connection
 * they would give away raw first goes back to plain TCP (BACK/RETURN,
 * src/stream/stream_back.c), with nothing held by libsovia, and the call
 * then goes to the kernel, which is right about the socket again; where
 * the copies module can follow the connection (src/share/share.h), it is
 * kept, handed or continued instead. Correctness wins over acceleration:
 *
 *   fork, vfork            each connection as sv_share_detach_for_fork
 *                          decides: one settled on RDMA stays on the
 *                          parent's QP, the child's fd a copy (foreign.c),
 *                          with SOVIA_FORK_KEEP and a kernel that copies
 *                          pinned pages at a fork; a server's whose upgrade
 *                          has not begun is handed to the child (held.c);
 *                          any other goes back first (a client's is then
 *                          shared with the child, a server's back with
 *                          known counts handed to it)
 *   exec*, fexecve,        those that survive the exec (no FD_CLOEXEC), but
 *   execveat               a connection handed to this process and still
 *                          untouched, and a client's back on TCP on one fd:
 *                          the new image continues them (exec_hand.c)
 *   posix_spawn[p]         every one (file actions may hand any fd over)
 *   system, popen          those that survive into the shell (no
 *                          FD_CLOEXEC): glibc spawns it with its internal
 *                          posix_spawn, past the interposed one
 *   wordexp                the same, for a command substitution's shell
 *   daemon                 every one: glibc forks with its internal fork
 *                          and the parent leaves by its internal _exit
 *   forkpty                every one: glibc forks with its internal fork
 *   sendmsg, sendmmsg      every socket passed in SCM_RIGHTS (the receiver
 *                          gets the kernel's socket)
 *
 * sendfile and splice are served (sendfile.c), but for a sendfile from
 * what is not a regular file, which takes its connection back first. */
#include "log.h"
#include "preload.h"
#include "real.h"
#include "sovia_ops.h"

#include <errno.h>
#include <fcntl.h>
#include <pty.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <wordexp.h>

/* ---- Going back to plain TCP ---------------------------------------------- */

void sv_fd_detach(int fd, const char *call)
{
	struct sv_fd *f = sv_fd_get(fd);
	if (f && f->ops->detach)
		f->ops->detach(f, call);
	sv_fd_put(f);
}

/* Each fd msg passes in its SCM_RIGHTS control messages (as the kernel
 * will read them: never past msg_controllen) goes back to plain TCP; from
 * inside libsovia none can (reentry.c), and false when one is a
 * connection libsovia serves. */
static bool detach_rights(const struct msghdr *msg, bool inside)
{
	struct msghdr *m = (struct msghdr *)msg; /* CMSG_NXTHDR's argument is not const */
	const unsigned char *end = (const unsigned char *)m->msg_control + m->msg_controllen;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS ||
		    c->cmsg_len < CMSG_LEN(0))
			continue;
		const unsigned char *data = CMSG_DATA(c);
		size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		if (data + n * sizeof(int) > end)
			n = (size_t)(end - data) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			int fd;
			memcpy(&fd, data + i * sizeof(int), sizeof(fd));
			if (!inside)
				sv_fd_detach(fd, "sendmsg(SCM_RIGHTS)");
			else if (sv_fd_claimed(fd, SV_MARK_SERVED))
				return false;
		}
	}
	return true;
}

bool sv_fd_detach_passed(const struct msghdr *msg)
{
	if (!msg || !msg->msg_control || msg->msg_controllen < sizeof(struct cmsghdr) ||
	    !atomic_load_explicit(&sv_initialised, memory_order_acquire))
		return true;
	int saved = errno;
	bool ok = detach_rights(msg, sv_tls_inside != 0);
	errno = saved;
	return ok;
}

void sv_fd_detach_all_for_fork(void)
{
	int n = sv_fdtable_size();
	for (int fd = 0; fd < n; fd++) {
		struct sv_fd *f = sv_fd_get(fd);
		if (f && f->ops->detach_for_fork)
			(void)f->ops->detach_for_fork(f);
		else if (f && f->ops->detach)
			(void)f->ops->detach(f, "fork");
		sv_fd_put(f);
	}
}

void sv_fd_detach_all(bool surviving_exec, const char *call)
{
	int n = sv_fdtable_size();
	for (int fd = 0; fd < n; fd++) {
		struct sv_fd *f = sv_fd_get(fd);
		if (!f)
			continue;
		bool served = f->ops->detach != NULL;
		sv_fd_put(f);
		if (!served)
			continue;
		if (surviving_exec) {
			int fl = sv_real.fcntl(fd, F_GETFD, 0);
			if (fl >= 0 && (fl & FD_CLOEXEC))
				continue;
		}
		sv_fd_detach(fd, call);
	}
}

/* From inside libsovia (reentry.c) no connection can go back to TCP: a
 * call that would hand one libsovia serves to another image or process is
 * refused. */
static bool handover_refused(bool surviving_exec)
{
	if (!sv_reentered())
		return false;
	int n = sv_fdtable_size();
	for (int fd = 0; fd < n; fd++) {
		if (!sv_fd_claimed(fd, SV_MARK_SERVED))
			continue;
		int fl = surviving_exec ? sv_real.fcntl(fd, F_GETFD, 0) : 0;
		if (fl >= 0 && (fl & FD_CLOEXEC))
			continue;
		return true;
	}
	return false;
}

/* The connections a process or image is about to get go back to TCP, or
 * the call `name` ends with `fail` (refused from inside libsovia). */
#define HAND_OVER(name, surviving_exec, fail)                                               \
	do {                                                                                \
		if (handover_refused(surviving_exec)) {                                     \
			sv_refuse(-1, name, EBUSY);                                         \
			return fail;                                                        \
		}                                                                           \
		ENTER_DETACH_ALL(surviving_exec, name);                                     \
	} while (0)

/* Run `detach` before passing the call through, keeping errno, unless the
 * call comes from libsovia itself (or before initialisation). */
#define ENTER_DETACHING(detach)                                                             \
	do {                                                                                \
		if (!sv_passthrough()) {                                                    \
			int saved_ = errno;                                                 \
			detach;                                                             \
			errno = saved_;                                                     \
		}                                                                           \
	} while (0)
#define ENTER_DETACH_ALL(surviving_exec, name)                                              \
	ENTER_DETACHING(sv_fd_detach_all(surviving_exec, name))

/* ---- Processes ------------------------------------------------------------ */

/* A server connection accepted just before the fork (accept-then-fork
 * servers) is handed to the child, which takes it to RDMA once the
 * parent has closed its copy (held.c). */
SV_EXPORT pid_t fork(void)
{
	if (handover_refused(false)) {
		sv_refuse(-1, "fork", EBUSY);
		return -1;
	}
	bool locking = !sv_passthrough();
	if (locking)
		sv_foreign_fork_lock();
	ENTER_DETACHING(sv_fd_detach_all_for_fork());
	pid_t pid = SV_REAL(fork)();
	if (locking) {
		int saved = errno;
		sv_foreign_fork_unlock(pid);
		sv_ops_after_fork(pid);
		errno = saved;
	}
	return pid;
}

/* A vfork child may only exec or _exit; a fork does the same job, with our
 * fork handlers run. */
SV_EXPORT pid_t vfork(void)
{
	return fork();
}

/* An exec hands the connections handed to this process on to the new
 * image (exec_hand.c), and takes the others it keeps back to plain TCP.
 * False: refused from inside libsovia. */
static bool exec_begin(const char *name, char *const envp[], struct sv_exec_env *ex)
{
	*ex = (struct sv_exec_env){.table_fd = -1};
	if (handover_refused(true)) {
		sv_refuse(-1, name, EBUSY);
		return false;
	}
	ENTER_DETACHING(sv_exec_prepare(name, envp, ex));
	return true;
}

/* The exec failed: what was made for the new image goes (keeps errno). */
static int exec_failed(struct sv_exec_env *ex, int r)
{
	sv_exec_env_done(ex);
	return r;
}

SV_EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	struct sv_exec_env ex;
	if (!exec_begin("execve", envp, &ex))
		return -1;
	return exec_failed(&ex, SV_REAL(execve)(path, argv, ex.envp ? ex.envp : envp));
}

SV_EXPORT int execv(const char *path, char *const argv[])
{
	struct sv_exec_env ex;
	if (!exec_begin("execv", environ, &ex))
		return -1;
	return exec_failed(&ex, ex.envp ? SV_REAL(execve)(path, argv, ex.envp)
					: SV_REAL(execv)(path, argv));
}

SV_EXPORT int execvp(const char *file, char *const argv[])
{
	struct sv_exec_env ex;
	if (!exec_begin("execvp", environ, &ex))
		return -1;
	return exec_failed(&ex, ex.envp ? SV_REAL(execvpe)(file, argv, ex.envp)
					: SV_REAL(execvp)(file, argv));
}

SV_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	struct sv_exec_env ex;
	if (!exec_begin("execvpe", envp, &ex))
		return -1;
	return exec_failed(&ex, SV_REAL(execvpe)(file, argv, ex.envp ? ex.envp : envp));
}

SV_EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	struct sv_exec_env ex;
	if (!exec_begin("fexecve", envp, &ex))
		return -1;
	return exec_failed(&ex, SV_REAL(fexecve)(fd, argv, ex.envp ? ex.envp : envp));
}

SV_EXPORT int execveat(int dirfd, const char *path, char *const argv[], char *const envp[],
			int flags)
{
	struct sv_exec_env ex;
	if (!exec_begin("execveat", envp, &ex))
		return -1;
	return exec_failed(&ex, SV_REAL(execveat)(dirfd, path, argv, ex.envp ? ex.envp : envp,
						  flags));
}

/* execl, execlp, execle: the list becomes an argv for execv, execvp or
 * execve (which hand on or detach). */
enum exec_kind { EXEC_PATH, EXEC_SEARCH, EXEC_ENV };

static int exec_list(enum exec_kind kind, const char *file, const char *arg0, va_list ap)
{
	va_list cp;
	va_copy(cp, ap);
	size_t n = 1;
	while (va_arg(cp, char *))
		n++;
	va_end(cp);
	char **argv = malloc((n + 1) * sizeof(*argv));
	if (!argv) {
		errno = ENOMEM;
		return -1;
	}
	argv[0] = (char *)arg0;
	for (size_t i = 1; i <= n; i++)
		argv[i] = va_arg(ap, char *); /* argv[n] is the terminating NULL */
	int r;
	switch (kind) {
	case EXEC_PATH:
		r = execv(file, argv);
		break;
	case EXEC_SEARCH:
		r = execvp(file, argv);
		break;
	case EXEC_ENV:
		r = execve(file, argv, va_arg(ap, char *const *));
		break;
	}
	int e = errno;
	free(argv);
	errno = e;
	return r;
}

#define EXEC_LIST(kind, file, arg)                                                          \
	do {                                                                                \
		va_list ap;                                                                 \
		va_start(ap, arg);                                                          \
		int r_ = exec_list(kind, file, arg, ap);                                    \
		va_end(ap);                                                                 \
		return r_;                                                                  \
	} while (0)

SV_EXPORT int execl(const char *path, const char *arg, ...)
{
	EXEC_LIST(EXEC_PATH, path, arg);
}

SV_EXPORT int execlp(const char *file, const char *arg, ...)
{
	EXEC_LIST(EXEC_SEARCH, file, arg);
}

SV_EXPORT int execle(const char *path, const char *arg, ...)
{
	EXEC_LIST(EXEC_ENV, path, arg);
}

SV_EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
			  const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	HAND_OVER("posix_spawn", false, EBUSY); /* it returns the error number */
	return SV_REAL(posix_spawn)(pid, path, fa, attr, argv, envp);
}

SV_EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
			   const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	HAND_OVER("posix_spawnp", false, EBUSY);
	return SV_REAL(posix_spawnp)(pid, file, fa, attr, argv, envp);
}

/* The shell they start is a new image, as after exec: what it inherits is
 * the connections without FD_CLOEXEC (and popen's pipe). system(NULL)
 * only asks whether there is a shell. */
SV_EXPORT int system(const char *cmd)
{
	if (cmd)
		HAND_OVER("system", true, -1);
	return SV_REAL(system)(cmd);
}

SV_EXPORT FILE *popen(const char *cmd, const char *type)
{
	HAND_OVER("popen", true, NULL);
	return SV_REAL(popen)(cmd, type);
}

/* A command substitution, $(...) or `...`, runs in /bin/sh -c, spawned by
 * glibc's internal posix_spawn: the shell inherits the connections without
 * FD_CLOEXEC, as system()'s does. Nothing else wordexp expands starts a
 * process, so only words that can hold one take them back (an arithmetic
 * $(( )) too, harmlessly); WRDE_NOCMD refuses substitutions unrun. */
SV_EXPORT int wordexp(const char *words, wordexp_t *we, int flags)
{
	if (words && !(flags & WRDE_NOCMD) && (strchr(words, '`') || strstr(words, "$(")))
		HAND_OVER("wordexp", true, WRDE_NOSPACE); /* its only error for "could not" */
	return SV_REAL(wordexp)(words, we, flags);
}

/* daemon() forks with glibc's internal fork, so this file's fork() never
 * runs (the fork handlers do: the child's libsovia is reset), and the
 * parent leaves by glibc's internal _exit, past quick_exit_flush: what the
 * parent's QPs carried or held would be lost, and the child would find
 * only the kernel's sockets. Every connection goes back to TCP first: none
 * can be kept, handed or shared, as our fork() may, since this fork is not
 * ours. */
SV_EXPORT int daemon(int nochdir, int noclose)
{
	HAND_OVER("daemon", false, -1);
	return SV_REAL(daemon)(nochdir, noclose);
}

/* forkpty forks with glibc's internal fork too (since 2.34, in libc): the
 * child's entries become the kernel's, so the shell it usually execs
 * would get served sockets raw. Every connection goes back first, as for
 * daemon(). */
SV_EXPORT pid_t forkpty(int *master, char *name, const struct termios *tp,
			const struct winsize *wp)
{
	HAND_OVER("forkpty", false, -1);
	return SV_REAL(forkpty)(master, name, tp, wp);
}
