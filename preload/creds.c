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
 * nothing. */
#include "guard.h"
#include "helper.h"
#include "preload.h"
#include "real.h"

#include <errno.h>
#include <grp.h>
#include <sys/fsuid.h>
#include <unistd.h>

static void changed(const char *call)
{
	int saved = errno;
	sv_enter(); /* the helper's lock: a signal handler must not wait for it */
	sv_helper_creds_changed(call);
	sv_leave();
	errno = saved;
}

#define SV_CRED_CALL(name, params, args)                                                    \
	SV_EXPORT int name params                                                           \
	{                                                                                   \
		int rc_ = SV_REAL(name) args;                                               \
		if (rc_ == 0 && !sv_passthrough())                                          \
			changed(#name);                                                     \
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
		changed("setfsuid");
	return r;
}

SV_EXPORT int setfsgid(gid_t g)
{
	int r = SV_REAL(setfsgid)(g);
	if (!sv_passthrough() && (gid_t)r != g)
		changed("setfsgid");
	return r;
}
