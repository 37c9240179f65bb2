/* Credential changes (setuid, seteuid, setgroups, ...).
 *
 * The kernel lets only a task with the very credentials that opened an RDMA
 * file write to it (ib_safe_file_access: the same struct cred, not merely
 * the same ids). glibc applies seteuid and friends to each thread, each
 * getting a credential object of its own; so once the process changed
 * credentials, the files opened before refuse every thread's writes (ftpd
 * switches euid around each data connection's bind). Every rdma_cm call is
 * such a write, and so is rxe's doorbell after each post. Each change is
 * told to the helper, which moves the rdma_cm ids to a channel of its new
 * credentials and makes every later rdma_cm call itself (helper.c); rxe's
 * doorbell goes through ioctl, which is not checked (verbs_db.c). A change
 * before libsovia's first use of RDMA (it opens RDMA lazily) changes
 * nothing.
 *
 * A change of user or group ids also leaves the family's shared tables
 * (docs/design.md, "Who trusts whom"): the holders' table, which tells a
 * port's owner where to send a client, and the kept connections' tables
 * of its ancestors. Any process mapping them can write them; a process
 * that dropped privileges may be taken over by whoever it then serves,
 * and must not steer its family's clients nor their copies. What its fds
 * have in them is settled first (their leave_family op), then the
 * mappings are replaced in place (sv_holders_leave_family,
 * sv_shares_leave_family). The same ids set again (seteuid(0) as root)
 * leave nothing; setfsuid and setfsgid change no such id. A change made
 * by a raw system call (syscall(2), one thread's) is not followed. */
#include "fdtable.h"
#include "guard.h"
#include "helper.h"
#include "holders.h"
#include "log.h"
#include "preload.h"
#include "real.h"
#include "shares.h"

#include <errno.h>
#include <grp.h>
#include <string.h>
#include <sys/fsuid.h>
#include <unistd.h>

struct ids {
	uid_t u[3];
	gid_t g[3];
};

static void ids_now(struct ids *x)
{
	memset(x, 0, sizeof(*x));
	(void)getresuid(&x->u[0], &x->u[1], &x->u[2]);
	(void)getresgid(&x->g[0], &x->g[1], &x->g[2]);
}

static void leave_family(const char *call)
{
	int size = sv_fdtable_size();
	for (int fd = 0; fd < size; fd++) {
		struct sv_fd *f = sv_fd_get(fd);
		if (!f)
			continue;
		if (f->ops->leave_family)
			f->ops->leave_family(f);
		sv_fd_put(f);
	}
	int r = sv_holders_leave_family();
	int q = sv_shares_leave_family();
	if (r < 0 || q < 0)
		sv_warn("%s: the family's shared tables could not all be left (%s): this process "
			"still shares them", call, strerror(r < 0 ? -r : -q));
	else
		sv_dbg("%s: the ids changed: this process left its family's shared tables", call);
}

static void changed(const char *call, const struct ids *before)
{
	int saved = errno;
	sv_enter(); /* the helper's lock: a signal handler must not wait for it */
	sv_helper_creds_changed(call);
	struct ids after;
	ids_now(&after);
	if (before && memcmp(before, &after, sizeof(after)) != 0)
		leave_family(call);
	sv_leave();
	errno = saved;
}

#define SV_CRED_CALL(name, params, args)                                                    \
	SV_EXPORT int name params                                                           \
	{                                                                                   \
		struct ids before_;                                                         \
		bool ours_ = !sv_passthrough();                                             \
		if (ours_)                                                                  \
			ids_now(&before_);                                                  \
		int rc_ = SV_REAL(name) args;                                               \
		if (rc_ == 0 && ours_)                                                      \
			changed(#name, &before_);                                           \
		return rc_;                                                                 \
	}

SV_CRED_CALL(setuid, (uid_t u), (u))
SV_CRED_CALL(setgid, (gid_t g), (g))
SV_CRED_CALL(seteuid, (uid_t u), (u))
SV_CRED_CALL(setegid, (gid_t g), (g))
SV_CRED_CALL(setreuid, (uid_t r, uid_t e), (r, e))
SV_CRED_CALL(setregid, (gid_t r, gid_t e), (r, e))
SV_CRED_CALL(setresuid, (uid_t r, uid_t e, uid_t s), (r, e, s))
SV_CRED_CALL(setresgid, (gid_t r, gid_t e, gid_t s), (r, e, s))
SV_CRED_CALL(setgroups, (size_t n, const gid_t *g), (n, g))
SV_CRED_CALL(initgroups, (const char *user, gid_t g), (user, g))

/* setfsuid and setfsgid return the previous id and change only the calling
 * thread; any call may have changed its credentials. */
SV_EXPORT int setfsuid(uid_t u)
{
	int r = SV_REAL(setfsuid)(u);
	if (!sv_passthrough() && (uid_t)r != u)
		changed("setfsuid", NULL);
	return r;
}

SV_EXPORT int setfsgid(gid_t g)
{
	int r = SV_REAL(setfsgid)(g);
	if (!sv_passthrough() && (gid_t)r != g)
		changed("setfsgid", NULL);
	return r;
}
