/* The registration cache of zero-copy sends: memory regions of the
 * application's memory, registered once and reused by later sends from the
 * same pages, one cache per protection domain (so shared by every
 * connection on a device). See regcache.c for why a cached registration is
 * only ever used after checking that the application's addresses still map
 * the very pages the registration pinned.
 *
 * The cache knows nothing of verbs: registering and deregistering are
 * callbacks (verbs.c passes ibv_reg_mr/ibv_dereg_mr, the unit tests a fake),
 * and so is the source of page identities (by default /proc/self/pagemap).
 * It is thread-safe: one mutex, never held across a callback. */
#ifndef SV_REGCACHE_H
#define SV_REGCACHE_H

#include <stddef.h>
#include <stdint.h>

struct sv_regcache;
struct sv_regcache_ent;

struct sv_regcache_ops {
	/* Register [addr, addr + len) for local read access (sends); store an
	 * opaque handle and its lkey. Returns 0 or -errno. */
	int (*reg)(void *ctx, void *addr, size_t len, void **mr, uint32_t *lkey);
	/* Deregister a handle reg returned. */
	void (*dereg)(void *ctx, void *mr);
	/* Optional (NULL: /proc/self/pagemap). Fill ids[i] with an identity of
	 * the physical page mapped now at virtual page start + i * page_size,
	 * 0 when none is mapped or it cannot be told; two different physical
	 * pages never share an identity. Returns 0, or -errno when no identity
	 * can be had at all (the cache then stops caching for good). */
	int (*page_ids)(void *ctx, uintptr_t start, size_t npages, uint64_t *ids);
};

struct sv_regcache_params {
	size_t page_size;     /* 0: the system's */
	uint32_t max_entries; /* cached registrations kept, at most */
	size_t max_bytes;     /* bytes they cover (and pin), at most */
	size_t window;        /* a miss registers the request's pages and the present
			       * pages after them, up to this many bytes from its first
			       * page (0: the request's pages only) */
};

struct sv_regcache_stats {
	uint64_t hits;        /* a cached registration was valid and used */
	uint64_t misses;      /* a registration was made */
	uint64_t stale;       /* a cached registration no longer matched the pages */
	uint64_t uncached;    /* registrations made for one use only */
	uint64_t evictions;   /* dropped to stay within the bounds */
	uint64_t invalidated; /* dropped by sv_regcache_invalidate */
	uint32_t entries;     /* cached now */
	size_t bytes;         /* covered by them */
	int enabled;          /* 0 once page identities are unavailable */
};

/* The defaults the verbs transport uses: 64 entries, 32 MiB (without
 * CAP_IPC_LOCK at most a quarter of a finite RLIMIT_MEMLOCK), a 256 KiB
 * window. */
void sv_regcache_default_params(struct sv_regcache_params *prm);

/* Create a cache. With ops->page_ids NULL it opens /proc/self/pagemap; when
 * the process cannot see page frame numbers there (no CAP_SYS_ADMIN) the
 * cache works uncached: every get registers, every last put deregisters.
 * Returns 0 or -errno. */
int sv_regcache_create(struct sv_regcache **out, const struct sv_regcache_ops *ops, void *ctx,
		       const struct sv_regcache_params *prm);

/* Deregister everything and free the cache. Every entry must have been put
 * (a held one is reported and deregistered all the same). Safe on NULL. */
void sv_regcache_destroy(struct sv_regcache *rc);

/* A registration covering [addr, addr + len), len > 0, whose pages are
 * the ones mapped at those addresses now: a valid cached one, or a new one
 * (cached if it can be). The entry is held until sv_regcache_put, and is
 * never deregistered while held. Returns 0 or -errno (the reg callback's
 * error: -ENOMEM/-EAGAIN are retried once after dropping idle entries). */
int sv_regcache_get(struct sv_regcache *rc, const void *addr, size_t len,
		    struct sv_regcache_ent **out);

/* The entry's local key, for scatter/gather entries inside it. */
uint32_t sv_regcache_lkey(const struct sv_regcache_ent *e);

/* Release an entry from sv_regcache_get (after the send's completion). */
void sv_regcache_put(struct sv_regcache *rc, struct sv_regcache_ent *e);

/* Drop every cached registration overlapping [addr, addr + len): idle
 * ones at once, held ones at their last put. Not needed for correctness
 * (every use is checked against the page identities), but lets an unmap
 * hook give the pinned pages back early. */
void sv_regcache_invalidate(struct sv_regcache *rc, const void *addr, size_t len);

/* Drop every idle cached registration (to give pinned memory back).
 * Returns how many were dropped. */
unsigned int sv_regcache_flush(struct sv_regcache *rc);

void sv_regcache_get_stats(struct sv_regcache *rc, struct sv_regcache_stats *st);

/* Stop caching for good (entries are dropped as they become idle). */
void sv_regcache_disable(struct sv_regcache *rc);

#endif
