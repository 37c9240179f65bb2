/* The peer table (peers.h): a fixed array of slots in a file mapped by
 * every process of the user, written without locks.
 *
 * Each slot has a sequence number, odd while a writer fills it. A writer
 * claims a slot by moving its number from even to odd (a writer that
 * loses the race skips its update: a lost hint costs one connection its
 * first bytes on TCP); a reader takes what it read only if the number was
 * even and did not change meanwhile. Every field is an atomic word, so
 * threads and processes race only on hints. A key hashes to a run of
 * SV_PEERS_PROBE slots; a new key takes an empty one or the oldest.
 *
 * The file is /dev/shm/libsovia-peers.EUID, 0600. One that is not a
 * regular file of ours with no access for others, or not of this layout,
 * is left alone: the process keeps a table of its own. */
#include "peers.h"

#include "log.h"
#include "real.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SV_PEERS_MAGIC 0x52505653u /* "SVPR" */
#define SV_PEERS_VERSION 1u
#define SV_PEERS_SLOTS 1024u
#define SV_PEERS_PROBE 8u
/* A host not seen for this long is not expected to answer any more. */
#define SV_PEERS_TTL_S (24u * 3600u)
/* A plain port or a host without a route is tried again after this long. */
#define SV_PEERS_PLAIN_TTL_S 60u

/* key[0..3]: the address as IPv6 (IPv4 mapped, ::ffff:a.b.c.d), network
 * order; key[4]: the kind, and a port in network order:
 *   KIND_HOST << 16        a host (setup_us: time to RDMA, 0: no route);
 *   KIND_PORT << 16 | port a plain server's port (setup_us 0);
 *   KIND_CLIENT << 16      a plain client's host (setup_us 0);
 *   KIND_SELF << 16        address all zero: this host's longest rdma_cm
 *                          start-up (setup_us).
 * An empty slot's key is all zero and matches nothing. */
enum { KIND_HOST = 1, KIND_PORT = 2, KIND_CLIENT = 3, KIND_SELF = 4 };
struct slot {
	_Atomic uint32_t seq;
	_Atomic uint32_t key[5];
	_Atomic uint32_t setup_us; /* host: time to RDMA (0: no route); port: 0 */
	_Atomic uint32_t stamp;    /* CLOCK_BOOTTIME seconds of the last write */
};

struct table {
	_Atomic uint32_t magic, version, nslots, pad;
	struct slot slots[SV_PEERS_SLOTS];
};

static struct table *tab;
static const char *use_path;
static bool use_local;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static struct table *map_file(const char *path)
{
	int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return NULL;
	struct table *t = NULL;
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
	    (st.st_mode & 077))
		goto close_fd;
	if (st.st_size == 0 && ftruncate(fd, sizeof(*t)) < 0)
		goto close_fd;
	if (st.st_size != 0 && st.st_size != (off_t)sizeof(*t))
		goto close_fd;
	void *m = mmap(NULL, sizeof(*t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		goto close_fd;
	t = m;
	/* A new file is all zero: the first process to look writes the
	 * header. One that says otherwise is another layout. */
	uint32_t zero = 0;
	if (atomic_compare_exchange_strong(&t->magic, &zero, SV_PEERS_MAGIC)) {
		atomic_store(&t->nslots, SV_PEERS_SLOTS);
		atomic_store(&t->version, SV_PEERS_VERSION);
	}
	if (atomic_load(&t->magic) != SV_PEERS_MAGIC ||
	    (atomic_load(&t->version) && atomic_load(&t->version) != SV_PEERS_VERSION)) {
		munmap(m, sizeof(*t));
		t = NULL;
	}
close_fd:
	SV_REAL(close)(fd);
	return t;
}

static void open_table(void)
{
	char def[64];
	const char *path = use_path;
	if (!path && !use_local) {
		snprintf(def, sizeof(def), "/dev/shm/libsovia-peers.%u", (unsigned)geteuid());
		path = def;
	}
	tab = path ? map_file(path) : NULL;
	if (tab)
		sv_dbg("peer table %s", path);
	if (!tab) {
		if (path)
			sv_dbg("peer table %s not usable: this process keeps its own", path);
		tab = calloc(1, sizeof(*tab));
	}
}

static struct table *table(void)
{
	pthread_once(&once, open_table);
	return tab;
}

void sv_peers_use(const char *path)
{
	use_path = path;
	use_local = !path;
}

static uint32_t now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_BOOTTIME, &ts);
	return (uint32_t)ts.tv_sec + 1; /* never 0 */
}

/* The key of kind `kind` for a peer's address (its port only in
 * KIND_PORT's). False for an address that is neither IPv4 nor IPv6. */
static bool kind_key(const struct sockaddr_storage *ss, unsigned kind, uint32_t key[5])
{
	uint8_t a[16];
	uint16_t p;
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
		memset(a, 0, 10);
		a[10] = a[11] = 0xff;
		memcpy(a + 12, &in->sin_addr, 4);
		p = in->sin_port;
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
		memcpy(a, &in6->sin6_addr, 16);
		p = in6->sin6_port;
	} else {
		return false;
	}
	memcpy(key, a, 16);
	key[4] = kind << 16 | (kind == KIND_PORT ? p : 0u); /* kinds never share a key */
	return true;
}

/* The key of a peer's host (port false) or of its port. */
static bool make_key(const struct sockaddr_storage *ss, bool port, uint32_t key[5])
{
	return kind_key(ss, port ? KIND_PORT : KIND_HOST, key);
}

static uint32_t hash(const uint32_t key[5])
{
	uint32_t h = 2166136261u; /* FNV-1a over the words */
	for (int i = 0; i < 5; i++) {
		h ^= key[i];
		h *= 16777619u;
	}
	return h ^ (h >> 15);
}

/* A consistent copy of a slot; false while a writer fills it. */
static bool read_slot(struct slot *s, uint32_t key[5], uint32_t *setup, uint32_t *stamp)
{
	uint32_t q = atomic_load_explicit(&s->seq, memory_order_acquire);
	if (q & 1)
		return false;
	for (int i = 0; i < 5; i++)
		key[i] = atomic_load_explicit(&s->key[i], memory_order_relaxed);
	*setup = atomic_load_explicit(&s->setup_us, memory_order_relaxed);
	*stamp = atomic_load_explicit(&s->stamp, memory_order_relaxed);
	atomic_thread_fence(memory_order_acquire);
	return atomic_load_explicit(&s->seq, memory_order_relaxed) == q;
}

static void write_slot(struct slot *s, const uint32_t key[5], uint32_t setup, uint32_t stamp)
{
	uint32_t q = atomic_load_explicit(&s->seq, memory_order_relaxed);
	if ((q & 1) || !atomic_compare_exchange_strong(&s->seq, &q, q + 1))
		return; /* another writer has it: this hint is lost */
	atomic_thread_fence(memory_order_release);
	for (int i = 0; i < 5; i++)
		atomic_store_explicit(&s->key[i], key[i], memory_order_relaxed);
	atomic_store_explicit(&s->setup_us, setup, memory_order_relaxed);
	atomic_store_explicit(&s->stamp, stamp, memory_order_relaxed);
	atomic_store_explicit(&s->seq, q + 2, memory_order_release);
}

/* The slot holding key (*age: seconds since it was written), or NULL. */
static struct slot *find(const uint32_t key[5], uint32_t *setup, uint32_t *age)
{
	struct table *t = table();
	if (!t)
		return NULL;
	uint32_t h = hash(key);
	for (uint32_t i = 0; i < SV_PEERS_PROBE; i++) {
		struct slot *s = &t->slots[(h + i) % SV_PEERS_SLOTS];
		uint32_t k[5], st, stamp;
		if (read_slot(s, k, &st, &stamp) && memcmp(k, key, sizeof(k)) == 0) {
			*setup = st;
			*age = now_s() - stamp;
			return s;
		}
	}
	return NULL;
}

/* Write key's entry: its own slot, else an empty one, else the oldest. */
static void put(const uint32_t key[5], uint32_t setup)
{
	struct table *t = table();
	if (!t)
		return;
	uint32_t h = hash(key), oldest = UINT32_MAX;
	struct slot *victim = NULL;
	for (uint32_t i = 0; i < SV_PEERS_PROBE; i++) {
		struct slot *s = &t->slots[(h + i) % SV_PEERS_SLOTS];
		uint32_t k[5], st, stamp;
		if (!read_slot(s, k, &st, &stamp))
			continue;
		if (memcmp(k, key, sizeof(k)) == 0) {
			victim = s;
			break;
		}
		if (k[4] == 0)
			stamp = 0; /* empty */
		if (stamp < oldest) {
			oldest = stamp;
			victim = s;
		}
	}
	if (victim)
		write_slot(victim, key, setup, now_s());
}

static void drop(const uint32_t key[5])
{
	uint32_t setup, age;
	struct slot *s = find(key, &setup, &age);
	static const uint32_t none[5];
	if (s)
		write_slot(s, none, 0, 0);
}

/* Is the port entry of peer there, written within `ttl` seconds? */
static bool port_marked(const struct sockaddr_storage *peer, uint32_t ttl)
{
	uint32_t port[5], ignored, age;
	return make_key(peer, true, port) && find(port, &ignored, &age) && age < ttl;
}

bool sv_peers_expect(const struct sockaddr_storage *peer, bool client, uint32_t *setup_us)
{
	uint32_t host[5], setup = 0, age;
	if (!make_key(peer, false, host) || !find(host, &setup, &age) || age >= SV_PEERS_TTL_S ||
	    !setup)
		return false;
	if (client && port_marked(peer, SV_PEERS_TTL_S))
		return false; /* a plain server on a libsovia host */
	*setup_us = setup;
	return true;
}

bool sv_peers_plain(const struct sockaddr_storage *peer)
{
	uint32_t host[5], setup = 1, age;
	if (make_key(peer, false, host) && find(host, &setup, &age) && !setup &&
	    age < SV_PEERS_PLAIN_TTL_S)
		return true; /* no route */
	return port_marked(peer, SV_PEERS_PLAIN_TTL_S);
}

void sv_peers_learn(const struct sockaddr_storage *peer, bool client, uint32_t setup_us)
{
	uint32_t key[5];
	if (!make_key(peer, false, key))
		return;
	put(key, setup_us ? setup_us : 1);
	if (client && make_key(peer, true, key))
		drop(key);
	if (kind_key(peer, KIND_CLIENT, key))
		drop(key);
}

bool sv_peers_first_contact(const struct sockaddr_storage *peer)
{
	uint32_t key[5], setup, age;
	if (!make_key(peer, false, key))
		return false;
	if (find(key, &setup, &age) && age < (setup ? SV_PEERS_TTL_S : SV_PEERS_PLAIN_TTL_S))
		return false; /* a libsovia host, or one without a route */
	return !(kind_key(peer, KIND_CLIENT, key) && find(key, &setup, &age) &&
		 age < SV_PEERS_TTL_S);
}

void sv_peers_plain_client(const struct sockaddr_storage *peer)
{
	uint32_t key[5];
	if (kind_key(peer, KIND_CLIENT, key))
		put(key, 0);
}

static const uint32_t self_key[5] = {0, 0, 0, 0, KIND_SELF << 16};
/* This process's longest, kept across fork: a prefork worker starts
 * rdma_cm with its parent's libraries and devices already loaded (a few
 * ms), which says nothing of a fresh client's start-up; its parent's
 * does, and its parent may have written it to another user's table. */
static _Atomic uint32_t own_startup;

void sv_peers_note_startup(uint32_t us)
{
	uint32_t setup, age, own = atomic_load(&own_startup);
	while (us > own && !atomic_compare_exchange_weak(&own_startup, &own, us))
		;
	if (!us || (find(self_key, &setup, &age) && age < SV_PEERS_TTL_S && setup >= us))
		return;
	put(self_key, us);
}

uint32_t sv_peers_startup(void)
{
	uint32_t setup, age, own = atomic_load(&own_startup);
	if (find(self_key, &setup, &age) && age < SV_PEERS_TTL_S && setup > own)
		return setup;
	return own;
}

void sv_peers_plain_port(const struct sockaddr_storage *peer)
{
	uint32_t key[5];
	if (make_key(peer, true, key))
		put(key, 0);
}

void sv_peers_no_route(const struct sockaddr_storage *peer)
{
	uint32_t key[5];
	if (make_key(peer, false, key))
		put(key, 0);
}
