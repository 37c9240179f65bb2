/* The locked-memory budget (pinned.h). */
#include "pinned.h"

#include "log.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static atomic_size_t taken;
static atomic_size_t budget; /* 0: not read yet */
static atomic_bool told;
/* A take was refused since the last give-back: the next one calls the hook. */
static atomic_bool room_wanted;
static void (*_Atomic room_hook)(void);

/* CAP_IPC_LOCK (capability 14) in the effective set: pinning is not limited. */
static bool can_lock_all(void)
{
	FILE *f = fopen("/proc/self/status", "re");
	if (!f)
		return false;
	char line[256];
	unsigned long long eff = 0;
	bool found = false;
	while (!found && fgets(line, sizeof(line), f))
		found = sscanf(line, "CapEff: %llx", &eff) == 1;
	fclose(f);
	return found && (eff >> 14 & 1);
}

size_t sv_pinned_budget(void)
{
	size_t b = atomic_load(&budget);
	if (b)
		return b;
	struct rlimit rl;
	if (can_lock_all() || getrlimit(RLIMIT_MEMLOCK, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY)
		b = SIZE_MAX;
	else
		b = (size_t)rl.rlim_cur / 4 * 3;
	size_t none = 0;
	atomic_compare_exchange_strong(&budget, &none, b ? b : 1);
	return atomic_load(&budget);
}

void sv_pinned_set_budget(size_t bytes)
{
	atomic_store(&budget, bytes ? bytes : 1);
}

/* Take `bytes` if they fit below `limit`. */
static int take_below(size_t limit, size_t bytes)
{
	size_t b = sv_pinned_budget(), t = atomic_load(&taken);
	do {
		if (b != SIZE_MAX && (t > limit || bytes > limit - t))
			return -ENOBUFS;
	} while (!atomic_compare_exchange_weak(&taken, &t, t + bytes));
	return 0;
}

int sv_pinned_take(size_t bytes)
{
	if (take_below(sv_pinned_budget(), bytes) == 0)
		return 0;
	/* Refused: room is wanted. Then once more, for a give-back between
	 * the refusal and the flag, which woke nobody (both are sequentially
	 * consistent: the giver sees the flag, or this try sees its room). */
	atomic_store(&room_wanted, true);
	return take_below(sv_pinned_budget(), bytes);
}

bool sv_pinned_fits_ever(size_t bytes)
{
	return bytes <= sv_pinned_budget();
}

void sv_pinned_tell(size_t bytes)
{
	if (atomic_exchange(&told, true))
		return;
	struct rlimit rl = {0};
	getrlimit(RLIMIT_MEMLOCK, &rl);
	sv_err("an RDMA connection needs %zu KiB of locked memory for its buffers; "
	       "%zu KiB of this process's %llu KiB (ulimit -l) are in use: it and "
	       "others stay on TCP (fallback=memlock). Raise ulimit -l, or lower "
	       "SOVIA_WINDOW or SOVIA_BUF_START",
	       bytes / 1024, atomic_load(&taken) / 1024, (unsigned long long)rl.rlim_cur / 1024);
}

void sv_pinned_on_room(void (*fn)(void))
{
	atomic_store(&room_hook, fn);
}

int sv_pinned_take_growth(size_t bytes)
{
	size_t b = sv_pinned_budget();
	return take_below(b == SIZE_MAX ? b : b - b / 4, bytes);
}

size_t sv_pinned_pages(size_t bytes)
{
	long ps = sysconf(_SC_PAGESIZE);
	size_t page = ps > 0 ? (size_t)ps : 4096;
	return (bytes + page - 1) / page * page;
}

void sv_pinned_give(size_t bytes)
{
	if (!bytes)
		return;
	atomic_fetch_sub(&taken, bytes);
	void (*fn)(void) = atomic_load(&room_hook);
	if (fn && atomic_exchange(&room_wanted, false))
		fn();
}

size_t sv_pinned_taken(void)
{
	return atomic_load(&taken);
}

void sv_pinned_atfork_child(void)
{
	atomic_store(&taken, 0);
	atomic_store(&room_wanted, false);
}
