/* The holders' table: see holders.h.
 *
 * Processes of one family share it without a lock. Each entry has a state
 * word: its generation, and whether it is free, being written, or ready.
 * A writer claims a free entry by compare-and-swap, fills it, then marks it
 * ready; a reader copies a ready entry and keeps the copy only if the state
 * word did not change meanwhile. Only the process that entered a
 * connection removes it (or, once that process has exited, whoever finds
 * it). The fields are atomic words, so a reader racing a writer reads a
 * mix that the state word then rejects, never undefined behaviour. */
#include "holders.h"

#include "cmdata.h"
#include "log.h"
#include "ownfd.h"
#include "procfd.h"
#include "real.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* Kernels since 6.3 refuse a memfd that could be made executable when
 * vm.memfd_noexec is 2; older ones refuse the flag (EINVAL). */
#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif

/* As many as an accept queue's default (net.core.somaxconn): a
 * full table costs the connections past it their upgrade, nothing else. */
#define SV_HOLDERS_SLOTS 4096u

/* The state word: generation << 26 | a handed entry's port << 10 |
 * flags << 2 | phase. The flags and the port of a handed connection
 * change by compare-and-swap on the whole word, so a change meant for one
 * generation never lands on the next. */
enum { SLOT_FREE = 0, SLOT_WRITING = 1, SLOT_READY = 2 };
enum {
	F_HANDED = 1,  /* a connection handed to a fork's child (sv_holders_hand) */
	F_ADOPTED = 2, /* the child took it (pid2) */
	F_CLAIMED = 4, /* the child's RDMA listener is at port */
	F_FIRST_GONE = 8, /* the first holder released its copy */
	F_SPOILED = 16, /* a third holder, or the first one's I/O: stays TCP */
	F_TOLD = 32 /* told over the channel by a process that left (pid checked) */
};
#define PHASE(st) ((st) & 3u)
#define FLAGS(st) ((unsigned)((st) >> 2) & 255u)
#define HPORT(st) ((uint16_t)((st) >> 10))
#define GEN(st) ((st) >> 26)
#define MAKE(gen, flags, phase) (((uint64_t)(gen) << 26) | ((uint64_t)(flags) << 2) | (phase))

/* server address, server port, client address, client port: 36 bytes. */
#define KEY_WORDS 9

struct slot {
	_Atomic uint64_t state;
	_Atomic uint32_t pid;  /* the holder (a handed one's first holder) */
	_Atomic uint32_t pid2; /* a handed connection's second holder */
	_Atomic uint32_t port; /* an entry's port, but a handed one's (HPORT) */
	_Atomic uint32_t key[KEY_WORDS];
};

/* Who made a table and for which layout: an exec'd image attaches only to
 * a table of this layout made by its own user (sv_holders_attach). Atomic
 * because any process holding the memfd can write them. */
#define SV_HOLDERS_MAGIC 0x736f7669612d686cULL /* "sovia-hl" */
#define SV_HOLDERS_VERSION 1u

struct sv_holders {
	_Atomic uint64_t magic;
	_Atomic uint32_t version;
	_Atomic uint32_t creator_uid;
	_Atomic uint32_t creator_gid;
	_Atomic bool forked;
	/* Entries made so far: a waiting request is looked up again only
	 * when it moved. */
	_Atomic uint64_t adds;
	/* Entries are taken lowest first: none at or above this index was
	 * ever used, and a lookup stops there. */
	_Atomic uint32_t high;
	struct slot slot[SV_HOLDERS_SLOTS];
};

static _Atomic(struct sv_holders *) table;
/* table's memfd, -1 when none; set by the thread that made the table, just
 * after publishing it: a racing first caller may see -1 for a moment,
 * which costs at most one exec hand (the table is a hint). */
static atomic_int table_fd = -1;
/* Tables of another image's family mapped here (sv_holders_attach). */
#define SV_HOLDERS_ATTACHED 4u
static _Atomic(struct sv_holders *) attached[SV_HOLDERS_ATTACHED];
static atomic_uint nattached;

/* The family's channel (a datagram socketpair made with the table): a
 * process of the family that changed its ids may no longer write the
 * table, so it tells its inherited listeners' entries here, and the
 * table's maker, the only one that reads it, enters each after checking
 * with the kernel that the sender (its pid, from SCM_CREDENTIALS) holds
 * that very connection. A liar can thus name a port for its own
 * connections only, which misdirects its own clients at worst. */
static atomic_int chan_rx = -1, chan_tx = -1;
static atomic_int chan_reader; /* the pid that made it */
/* A message carried what no libsovia sends (fds): taking it would close
 * them here, and a close can wait on whatever the sender chose, so the
 * channel is not read again (those entries are not found: TCP). */
static atomic_bool chan_spoiled;
/* The channel of the family this process left, and how many times it
 * left one (a listener's era: see sv_holders_era). */
static atomic_int told_tx = -1;
static atomic_uint era;

/* The seals an exec'd image requires: nobody holding the fd can shrink it
 * (the owner's accesses past the end would SIGBUS), grow it, or unseal. */
#define SV_HOLDERS_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

static int open_memfd(void)
{
	int fd = memfd_create("sovia-holders", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL);
	if (fd < 0 && errno == EINVAL) /* a kernel before 6.3 */
		fd = memfd_create("sovia-holders", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	return fd < 0 ? -errno : fd;
}

/* A sealed memfd of the table's size, mapped at *out (at `at` if not
 * NULL, replacing what was there); the fd (one of libsovia's own,
 * ownfd.h) or -errno. */
static int map_memfd(void *at, struct sv_holders **out)
{
	int r, fd = open_memfd();
	if (fd < 0)
		return fd;
	if (ftruncate(fd, sizeof(struct sv_holders)) < 0) {
		r = -errno;
		goto close_fd;
	}
	void *m = mmap(at, sizeof(struct sv_holders), PROT_READ | PROT_WRITE,
		       MAP_SHARED | (at ? MAP_FIXED : 0), fd, 0);
	if (m == MAP_FAILED) {
		r = -errno;
		goto close_fd;
	}
	if (SV_REAL(fcntl)(fd, F_ADD_SEALS, SV_HOLDERS_SEALS) < 0) {
		r = -errno;
		goto unmap;
	}
	/* Above the application's fds, and out of reach of its closefrom(3)
	 * (an inetd-style server's, before it execs the handed program). */
	*out = m;
	return sv_ownfd_move(fd);
unmap:
	if (!at)
		munmap(m, sizeof(struct sv_holders));
close_fd:
	SV_REAL(close)(fd);
	return r;
}

/* Who made the table: the header says so to an exec'd image that attaches
 * it. The real ids: a set-id creator's table (its file owned by the
 * effective id) then matches no attacher, whose ids must all agree. */
static void stamp(struct sv_holders *m)
{
	atomic_store_explicit(&m->magic, SV_HOLDERS_MAGIC, memory_order_relaxed);
	atomic_store_explicit(&m->version, SV_HOLDERS_VERSION, memory_order_relaxed);
	atomic_store_explicit(&m->creator_uid, (uint32_t)getuid(), memory_order_relaxed);
	atomic_store_explicit(&m->creator_gid, (uint32_t)getgid(), memory_order_relaxed);
}

/* The family's channel for a new table. Without it (no fds) a process of
 * the family that changes its ids has its inherited listeners' upgrades
 * stay on TCP. */
static void open_channel(void)
{
	int sv[2], on = 1;
	if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0)
		return;
	if (SV_REAL(setsockopt)(sv[0], SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)) < 0) {
		SV_REAL(close)(sv[0]);
		SV_REAL(close)(sv[1]);
		return;
	}
	atomic_store(&chan_reader, (int)getpid());
	atomic_store(&chan_spoiled, false);
	atomic_store(&chan_rx, sv_ownfd_move(sv[0]));
	atomic_store(&chan_tx, sv_ownfd_move(sv[1]));
}

/* Leaving: the family's channel is what this process tells from now on
 * (the first family it left: its inherited listeners are that family's);
 * it never reads the family's again. Its new table gets a channel of its
 * own. */
static void leave_channel(void)
{
	int rx = atomic_exchange(&chan_rx, -1), tx = atomic_exchange(&chan_tx, -1);
	if (rx >= 0)
		sv_ownfd_close(rx);
	int none = -1;
	if (tx >= 0 && !atomic_compare_exchange_strong(&told_tx, &none, tx))
		sv_ownfd_close(tx);
	atomic_fetch_add(&era, 1);
	open_channel();
}

/* The process's table (made here unless another thread was first). */
static struct sv_holders *make_table(void)
{
	/* Shared with the children this process forks, and with an image
	 * they exec given a copy of the fd; never unmapped (they and late
	 * requests may use it until the process ends). Untouched pages cost
	 * nothing. Without a memfd, forks still share an anonymous mapping. */
	struct sv_holders *m = NULL;
	int fd = map_memfd(NULL, &m);
	if (fd < 0) {
		void *a = mmap(NULL, sizeof(struct sv_holders), PROT_READ | PROT_WRITE,
			       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (a == MAP_FAILED)
			return NULL;
		m = a;
	}
	stamp(m);
	struct sv_holders *none = NULL;
	if (!atomic_compare_exchange_strong(&table, &none, m)) {
		munmap(m, sizeof(struct sv_holders));
		if (fd >= 0)
			sv_ownfd_close(fd);
		return none;
	}
	if (fd >= 0)
		atomic_store(&table_fd, fd);
	open_channel();
	return m;
}

struct sv_holders *sv_holders_get(void)
{
	struct sv_holders *h = atomic_load(&table);
	if (h)
		return h;
	/* The memfd's fallbacks (an old kernel's EINVAL) leave the caller's
	 * errno alone, as the anonymous mapping alone did. */
	int saved = errno;
	h = make_table();
	errno = saved;
	return h;
}

int sv_holders_fd(const struct sv_holders *h)
{
	return h && h == atomic_load(&table) ? atomic_load(&table_fd) : -1;
}

/* Is the file at fd a table's: a sealed memfd of the table's size? Its
 * owner in *uid. The seals are read first: once they are there, the size
 * seen after cannot change. */
static bool table_file(int fd, uid_t *uid)
{
	int seals = SV_REAL(fcntl)(fd, F_GET_SEALS);
	struct stat sb;
	/* Not a memfd, or resizable (a holder could SIGBUS us). */
	if (seals < 0 || (seals & SV_HOLDERS_SEALS) != SV_HOLDERS_SEALS || fstat(fd, &sb) < 0)
		return false;
	*uid = sb.st_uid;
	return S_ISREG(sb.st_mode) && sb.st_size == (off_t)sizeof(struct sv_holders);
}

bool sv_holders_is_table(int fd)
{
	uid_t uid;
	return fd >= 0 && table_file(fd, &uid);
}

/* Was the mapped table made by this layout and this image's user and
 * group? The ids must agree all round: a set-id image gets no table. */
static bool table_is_ours(struct sv_holders *h)
{
	uid_t uid = getuid();
	gid_t gid = getgid();
	return atomic_load_explicit(&h->magic, memory_order_relaxed) == SV_HOLDERS_MAGIC &&
	       atomic_load_explicit(&h->version, memory_order_relaxed) == SV_HOLDERS_VERSION &&
	       uid == geteuid() && gid == getegid() &&
	       atomic_load_explicit(&h->creator_uid, memory_order_relaxed) == (uint32_t)uid &&
	       atomic_load_explicit(&h->creator_gid, memory_order_relaxed) == (uint32_t)gid;
}

struct sv_holders *sv_holders_attach(int fd)
{
	uid_t owner;
	if (fd < 0 || !table_file(fd, &owner) || owner != geteuid())
		return NULL;
	void *m = mmap(NULL, sizeof(struct sv_holders), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		return NULL;
	if (!table_is_ours(m)) {
		munmap(m, sizeof(struct sv_holders));
		return NULL;
	}
	/* Listed, so that a change of credentials can leave it. An image
	 * attaches the one table it was handed; a full list refuses. */
	unsigned i = atomic_fetch_add(&nattached, 1);
	if (i >= SV_HOLDERS_ATTACHED) {
		atomic_fetch_sub(&nattached, 1);
		munmap(m, sizeof(struct sv_holders));
		return NULL;
	}
	atomic_store(&attached[i], (struct sv_holders *)m);
	return m;
}

/* ---- A change of credentials ---------------------------------------------------- */

/* Replace the shared table at h by a private one of zeros, or (own) by a
 * fresh shared table of this process's new credentials. Done in place, at
 * the same address: every pointer to it stays valid, and a thread that
 * reads it meanwhile reads one table or the other, never unmapped memory.
 * An entry of the old table that a racing add was writing may end half in
 * the new one: its key matches no connection, and its process's exit
 * frees it. */
static bool leave(struct sv_holders *h, bool own)
{
	if (own) {
		struct sv_holders *m = NULL;
		int fd = map_memfd(h, &m);
		if (fd >= 0) {
			stamp(h);
			int old = atomic_exchange(&table_fd, fd);
			if (old >= 0)
				sv_ownfd_close(old);
			return true;
		}
		if (mmap(h, sizeof(*h), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED,
			 -1, 0) != MAP_FAILED) {
			stamp(h);
			int old = atomic_exchange(&table_fd, -1);
			if (old >= 0)
				sv_ownfd_close(old);
			return true;
		}
	}
	return mmap(h, sizeof(*h), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
		    -1, 0) != MAP_FAILED;
}

int sv_holders_leave_family(void)
{
	int r = 0;
	struct sv_holders *h = atomic_load(&table);
	if (h && !leave(h, true))
		r = -errno;
	if (h)
		leave_channel();
	unsigned n = atomic_exchange(&nattached, 0);
	for (unsigned i = 0; i < n && i < SV_HOLDERS_ATTACHED; i++) {
		struct sv_holders *a = atomic_exchange(&attached[i], NULL);
		if (a && !leave(a, false))
			r = -errno;
	}
	return r;
}

void sv_holders_mark_forked(struct sv_holders *h)
{
	atomic_store(&h->forked, true);
}

bool sv_holders_forked(const struct sv_holders *h)
{
	return atomic_load(&((struct sv_holders *)h)->forked);
}

uint64_t sv_holders_adds(const struct sv_holders *h)
{
	return atomic_load(&((struct sv_holders *)h)->adds);
}

static int make_key(const struct sockaddr_storage *server, const struct sockaddr_storage *client,
		    uint32_t key[KEY_WORDS])
{
	uint8_t b[KEY_WORDS * 4];
	uint16_t sp, cp;
	int v4;
	if (sv_addr16(server, b, &sp, &v4) < 0 || sv_addr16(client, b + 18, &cp, &v4) < 0)
		return -EAFNOSUPPORT;
	memcpy(b + 16, &sp, 2);
	memcpy(b + 34, &cp, 2);
	memcpy(key, b, sizeof(b));
	return 0;
}

/* Is entry e's key this one? Its words as they are now: the caller judges
 * them by the state word around the look. */
static bool key_is(struct slot *e, const uint32_t key[KEY_WORDS])
{
	for (unsigned w = 0; w < KEY_WORDS; w++)
		if (atomic_load_explicit(&e->key[w], memory_order_relaxed) != key[w])
			return false;
	return true;
}

static int add(struct sv_holders *h, const struct sockaddr_storage *server,
	       const struct sockaddr_storage *client, uint16_t port, unsigned flags, uint64_t *gen,
	       pid_t pid)
{
	uint32_t key[KEY_WORDS];
	int r = make_key(server, client, key);
	if (r < 0)
		return r;
	for (unsigned i = 0; i < SV_HOLDERS_SLOTS; i++) {
		struct slot *e = &h->slot[i];
		uint64_t st = atomic_load(&e->state);
		if (PHASE(st) != SLOT_FREE)
			continue;
		uint64_t mine = MAKE(GEN(st) + 1, 0, SLOT_WRITING);
		if (!atomic_compare_exchange_strong(&e->state, &st, mine))
			continue;
		atomic_store_explicit(&e->pid, (uint32_t)pid, memory_order_relaxed);
		atomic_store_explicit(&e->pid2, 0, memory_order_relaxed);
		atomic_store_explicit(&e->port, port, memory_order_relaxed);
		for (unsigned w = 0; w < KEY_WORDS; w++)
			atomic_store_explicit(&e->key[w], key[w], memory_order_relaxed);
		atomic_store(&e->state, MAKE(GEN(mine), flags, SLOT_READY));
		if (gen)
			*gen = GEN(mine);
		uint32_t hi = atomic_load(&h->high);
		while (hi < i + 1 && !atomic_compare_exchange_weak(&h->high, &hi, i + 1))
			;
		atomic_fetch_add(&h->adds, 1);
		return (int)i;
	}
	return -ENOSPC;
}

int sv_holders_add(struct sv_holders *h, const struct sockaddr_storage *server,
		   const struct sockaddr_storage *client, uint16_t port)
{
	return add(h, server, client, port, 0, NULL, getpid());
}

/* Free a ready entry, if it is still of st's generation (its flags may
 * change meanwhile). */
static void free_slot(struct slot *e, uint64_t st)
{
	uint64_t gen = GEN(st);
	while (PHASE(st) == SLOT_READY && GEN(st) == gen &&
	       !atomic_compare_exchange_weak(&e->state, &st, MAKE(gen, 0, SLOT_FREE)))
		;
}

void sv_holders_remove(struct sv_holders *h, int slot)
{
	if (slot < 0 || (unsigned)slot >= SV_HOLDERS_SLOTS)
		return;
	struct slot *e = &h->slot[slot];
	uint64_t st = atomic_load(&e->state);
	if (PHASE(st) == SLOT_READY && !(FLAGS(st) & F_HANDED) &&
	    atomic_load(&e->pid) == (uint32_t)getpid())
		free_slot(e, st);
}

/* ---- Handed connections -------------------------------------------------------- */

int sv_holders_hand(struct sv_holders *h, const struct sockaddr_storage *server,
		    const struct sockaddr_storage *client, struct sv_hand *out)
{
	uint64_t gen = 0;
	int slot = add(h, server, client, 0, F_HANDED, &gen, getpid());
	if (slot < 0)
		return slot;
	sv_holders_mark_forked(h);
	*out = (struct sv_hand){.h = h, .slot = slot, .gen = gen};
	return 0;
}

static struct slot *hand_slot(const struct sv_hand *hd)
{
	if (!hd->h || hd->slot < 0 || (unsigned)hd->slot >= SV_HOLDERS_SLOTS)
		return NULL;
	return &hd->h->slot[hd->slot];
}

/* Set `flag` (and a port, if none yet) on the handed entry, if it is
 * still hd's; its flags before, or -1 when it is gone. */
static int set_bits(const struct sv_hand *hd, unsigned flag, uint16_t port)
{
	struct slot *e = hand_slot(hd);
	if (!e)
		return -1;
	uint64_t st = atomic_load(&e->state);
	for (;;) {
		if (PHASE(st) != SLOT_READY || GEN(st) != hd->gen)
			return -1;
		uint64_t to = st | ((uint64_t)flag << 2);
		if (!HPORT(st))
			to |= (uint64_t)port << 10;
		if (atomic_compare_exchange_weak(&e->state, &st, to))
			return (int)FLAGS(st);
	}
}

static int set_flag(const struct sv_hand *hd, unsigned flag)
{
	return set_bits(hd, flag, 0);
}

bool sv_holders_adopt(const struct sv_hand *hd)
{
	int was = set_flag(hd, F_ADOPTED);
	if (was < 0)
		return false;
	if (was & F_ADOPTED) {
		/* Another child has it already: three holders. */
		set_flag(hd, F_SPOILED);
		return false;
	}
	atomic_store(&hd->h->slot[hd->slot].pid2, (uint32_t)getpid());
	return true;
}

void sv_holders_claim(const struct sv_hand *hd, uint16_t port)
{
	if (set_bits(hd, F_CLAIMED, port) >= 0)
		atomic_fetch_add(&hd->h->adds, 1);
}

bool sv_holders_check(const struct sv_hand *hd, const struct sockaddr_storage *server,
		      const struct sockaddr_storage *client)
{
	struct slot *e = hand_slot(hd);
	uint32_t key[KEY_WORDS];
	if (!e || make_key(server, client, key) < 0)
		return false;
	uint64_t st = atomic_load(&e->state);
	if (PHASE(st) != SLOT_READY || GEN(st) != hd->gen)
		return false;
	bool same = key_is(e, key);
	uint32_t pid2 = atomic_load_explicit(&e->pid2, memory_order_relaxed);
	/* The copies above are of this generation only if it is still there
	 * after them (the fence keeps them before the second look). Its
	 * flags may have moved meanwhile (a release, a claim): judge the
	 * latest. */
	atomic_thread_fence(memory_order_acquire);
	st = atomic_load(&e->state);
	if (PHASE(st) != SLOT_READY || GEN(st) != hd->gen)
		return false;
	unsigned fl = FLAGS(st);
	return same && (fl & F_HANDED) && (fl & F_ADOPTED) && !(fl & F_SPOILED) &&
	       pid2 == (uint32_t)getpid();
}

void sv_holders_release_first(const struct sv_hand *hd)
{
	if (set_flag(hd, F_FIRST_GONE) >= 0)
		atomic_fetch_add(&hd->h->adds, 1);
}

void sv_holders_spoil(const struct sv_hand *hd)
{
	(void)set_flag(hd, F_SPOILED);
}

static bool alive(uint32_t pid)
{
	return !(kill((pid_t)pid, 0) < 0 && errno == ESRCH);
}

/* A handed entry whose child holds the connection alone. */
static bool child_alone(unsigned flags, uint32_t first)
{
	if (!(flags & F_ADOPTED) || (flags & F_SPOILED))
		return false;
	return (flags & F_FIRST_GONE) || !alive(first);
}

bool sv_holders_sole(const struct sv_hand *hd)
{
	struct slot *e = hand_slot(hd);
	if (!e)
		return false;
	uint64_t st = atomic_load(&e->state);
	uint32_t first = atomic_load(&e->pid);
	if (PHASE(st) != SLOT_READY || GEN(st) != hd->gen || atomic_load(&e->state) != st)
		return false;
	return child_alone(FLAGS(st), first) && atomic_load(&e->pid2) == (uint32_t)getpid();
}

uint16_t sv_holders_find(struct sv_holders *h, const struct sockaddr_storage *server,
			 const struct sockaddr_storage *client)
{
	uint32_t key[KEY_WORDS];
	if (make_key(server, client, key) < 0)
		return 0;
	uint32_t high = atomic_load(&h->high);
	uint16_t found = 0;
	for (unsigned i = 0; i < high && i < SV_HOLDERS_SLOTS; i++) {
		struct slot *e = &h->slot[i];
		uint64_t st = atomic_load(&e->state);
		if (PHASE(st) != SLOT_READY)
			continue;
		bool same = key_is(e, key);
		uint32_t pid = atomic_load_explicit(&e->pid, memory_order_relaxed);
		uint32_t pid2 = atomic_load_explicit(&e->pid2, memory_order_relaxed);
		uint32_t port = atomic_load_explicit(&e->port, memory_order_relaxed);
		if (!same || atomic_load(&e->state) != st)
			continue;
		unsigned fl = FLAGS(st);
		if (!(fl & F_HANDED)) {
			if (!alive(pid))
				free_slot(e, st); /* its process exited without removing it */
			else if (!found)
				found = (uint16_t)port;
			continue;
		}
		if ((!(fl & F_ADOPTED) && !alive(pid)) || ((fl & F_ADOPTED) && !alive(pid2))) {
			/* No child took it and the parent is gone, or the
			 * child that took it is. */
			free_slot(e, st);
			continue;
		}
		/* A handed entry outranks the entry its first holder may have
		 * made before (a prefork worker that forks per connection):
		 * the child's port once it holds the connection alone, else
		 * none yet. */
		return (fl & F_CLAIMED) && child_alone(fl, pid) ? HPORT(st) : 0;
	}
	return found;
}

void sv_holders_drop(const struct sv_hand *hd)
{
	struct slot *e = hand_slot(hd);
	if (!e)
		return;
	uint64_t st = atomic_load(&e->state);
	uint32_t me = (uint32_t)getpid();
	if (PHASE(st) == SLOT_READY && GEN(st) == hd->gen &&
	    (atomic_load(&e->pid) == me || atomic_load(&e->pid2) == me))
		free_slot(e, st);
}

/* ---- Entries told by a process that left the family -------------------------- */

#define SV_TOLD_MAGIC 0x736f7674u /* "sovt" */
enum { TOLD_HOLDS = 1, TOLD_GONE = 2 };

struct told {
	uint32_t magic;
	uint16_t kind;
	uint16_t port;
	struct sockaddr_storage server, client;
};

unsigned sv_holders_era(void)
{
	return atomic_load(&era);
}

int sv_holders_tell(const struct sockaddr_storage *server, const struct sockaddr_storage *client,
		    uint16_t port, bool gone)
{
	int fd = atomic_load(&told_tx);
	if (fd < 0)
		return -ENOTCONN;
	struct told m = {.magic = SV_TOLD_MAGIC, .kind = gone ? TOLD_GONE : TOLD_HOLDS,
			 .port = port, .server = *server, .client = *client};
	if (SV_REAL(send)(fd, &m, sizeof(m), MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof(m))
		return -errno;
	return SV_HOLDERS_TOLD;
}

/* The next message and its sender, taken off the channel: 1, or 0 when
 * there is none (or no more may be read). It is looked at first without
 * taking it: a message with fds attached is never taken. */
static int take_told(int rx, struct told *m, struct ucred *who)
{
	for (;;) {
		union {
			char buf[CMSG_SPACE(sizeof(struct ucred))];
			struct cmsghdr align;
		} cb;
		struct iovec iov = {.iov_base = m, .iov_len = sizeof(*m)};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.buf,
				    .msg_controllen = sizeof(cb.buf)};
		ssize_t n = SV_REAL(recvmsg)(rx, &mh, MSG_PEEK | MSG_DONTWAIT);
		if (n < 0)
			return 0;
		if (mh.msg_flags & MSG_CTRUNC) {
			atomic_store(&chan_spoiled, true);
			sv_warn("a process of this server's family sent file descriptors on "
				"libsovia's channel: its children that changed ids stay on TCP");
			return 0;
		}
		bool creds = false;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
			if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS &&
			    c->cmsg_len == CMSG_LEN(sizeof(*who))) {
				memcpy(who, CMSG_DATA(c), sizeof(*who));
				creds = true;
			}
		/* Nothing but bytes came with it: taking it costs nothing. */
		char drop;
		(void)SV_REAL(recv)(rx, &drop, sizeof(drop), MSG_DONTWAIT);
		if (creds && n == (ssize_t)sizeof(*m) && !(mh.msg_flags & MSG_TRUNC) &&
		    m->magic == SV_TOLD_MAGIC && who->pid > 0)
			return 1;
	}
}

static bool told_addr(const struct sockaddr_storage *a)
{
	return a->ss_family == AF_INET || a->ss_family == AF_INET6;
}

/* The told entry of (server, client) by pid, freed. */
static void forget(struct sv_holders *h, const struct told *m, pid_t pid)
{
	uint32_t key[KEY_WORDS];
	if (make_key(&m->server, &m->client, key) < 0)
		return;
	uint32_t high = atomic_load(&h->high);
	for (unsigned i = 0; i < high && i < SV_HOLDERS_SLOTS; i++) {
		struct slot *e = &h->slot[i];
		uint64_t st = atomic_load(&e->state);
		if (PHASE(st) != SLOT_READY || !(FLAGS(st) & F_TOLD) ||
		    atomic_load(&e->pid) != (uint32_t)pid)
			continue;
		if (key_is(e, key))
			free_slot(e, st);
	}
}

void sv_holders_collect(void)
{
	int rx = atomic_load(&chan_rx);
	struct sv_holders *h = atomic_load(&table);
	if (rx < 0 || !h || atomic_load(&chan_spoiled) ||
	    atomic_load(&chan_reader) != (int)getpid())
		return;
	struct told m;
	struct ucred who;
	/* A bounded batch per look: a flood waits for the next one. */
	for (int i = 0; i < 64 && take_told(rx, &m, &who); i++) {
		if (!told_addr(&m.server) || m.server.ss_family != m.client.ss_family)
			continue;
		if (m.kind == TOLD_GONE) {
			forget(h, &m, who.pid);
			continue;
		}
		uint64_t ino;
		if (m.kind != TOLD_HOLDS || !m.port || sv_tcp_inode(&m.server, &m.client, &ino) < 0 ||
		    !sv_pid_surely_holds(who.pid, ino)) {
			sv_dbg("a process of the family (pid %d) told a connection it does not "
			       "hold: not entered",
			       (int)who.pid);
			continue;
		}
		if (add(h, &m.server, &m.client, m.port, F_TOLD, NULL, who.pid) < 0)
			sv_info("the holders' table is full: an accepted connection's upgrade "
				"request will not find its process");
	}
}
