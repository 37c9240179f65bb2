/* Run-time settings, read once from the environment (SOVIA_*).
 * Every setting, its default and its range are listed in config.c's table and
 * documented in README.md. A bad value prints a clear message on stderr and
 * falls back to the default; it never aborts the program. */
#ifndef SV_CONFIG_H
#define SV_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* SOVIA_WINDOW's largest: the protocol's bound on a peer's receive
 * buffers too (proto.h). */
#define SV_WINDOW_MAX 1024
/* SOVIA_WARDEN_PORT's default, and sovia-warden's (warden.h). */
#define SV_WARDEN_PORT 1011

struct sv_config {
	bool disable;                 /* SOVIA_DISABLE: never accelerate, pure passthrough */
	int log_level;                /* SOVIA_LOG: error|warn|info|debug (or 0..3) */
	bool stats;                   /* SOVIA_STATS: print per-connection counters at exit */
	uint32_t window;              /* SOVIA_WINDOW: receive descriptors pre-posted = credits */
	uint32_t buf_size;            /* SOVIA_BUF_SIZE: payload bytes per message */
	uint32_t buf_start;           /* SOVIA_BUF_START: ... at first */
	uint32_t buf_idle_ms;         /* SOVIA_BUF_IDLE_MS: idle sending gives grown buffers back */
	uint32_t ack_delay;           /* SOVIA_ACK_DELAY: consumed descriptors before an ACK */
	uint32_t ack_timeout_us;      /* SOVIA_ACK_TIMEOUT_US: delayed-ACK timer */
	bool coalesce;                /* SOVIA_COALESCE: Nagle-style coalescing of small writes */
	uint32_t coalesce_size;       /* SOVIA_COALESCE_SIZE: coalescing buffer / threshold */
	uint32_t coalesce_timeout_us; /* SOVIA_COALESCE_TIMEOUT_US: coalescing flush timer */
	uint32_t reg_threshold;       /* SOVIA_REG_THRESHOLD: writes >= this are sent zero-copy */
	uint32_t upgrade_timeout_ms;  /* SOVIA_UPGRADE_TIMEOUT_MS: bound on the RDMA upgrade */
	uint32_t upgrade_delay_ms;    /* SOVIA_UPGRADE_DELAY_MS: a client's wait before it */
	uint32_t peer_hold_ms;        /* SOVIA_PEER_HOLD_MS: a known peer's connection holds
				       * its first writes for its QP at most this long */
	uint32_t spin_us;             /* SOVIA_SPIN_US: poll before sleeping in the kernel */
	bool privileged_ports;        /* SOVIA_PRIVILEGED_PORTS: clients upgrade only to
				       * server ports below 1024 */
	uint32_t warden_port;         /* SOVIA_WARDEN_PORT: sovia-warden's rdma_cm port
				       * (0: none is asked) */
	bool warden_required;         /* SOVIA_WARDEN_REQUIRED: clients upgrade only what
				       * the server host's warden vouches for */
	bool fork_keep;               /* SOVIA_FORK_KEEP: a fork leaves the parent's
				       * connections on RDMA until a child uses its copy */
	bool ask_again;               /* SOVIA_ASK_AGAIN: a client taken back to TCP by
				       * its server asks again at once */
};

typedef char *(*sv_getenv_fn)(const char *name);

/* One setting as its table gives it: for sovia-run, which turns flags into
 * settings and checks them before it starts a program. */
enum sv_setting_kind {
	SV_SETTING_BOOL,  /* 1/yes/true/on or 0/no/false/off */
	SV_SETTING_COUNT, /* a plain decimal count */
	SV_SETTING_BYTES, /* a count with an optional k/m suffix (powers of 1024) */
	SV_SETTING_LEVEL, /* a log level name or number */
};

struct sv_setting_desc {
	const char *name; /* SOVIA_... */
	const char *what;
	enum sv_setting_kind kind;
	uint32_t def, min, max;
};

/* The i-th setting, or NULL past the last. */
const struct sv_setting_desc *sv_config_setting(size_t i);

/* text as setting s's value: 0, -EINVAL when it is not of the setting's
 * form, -ERANGE when it is outside the setting's range. */
int sv_config_parse(const struct sv_setting_desc *s, const char *text, uint32_t *out);

/* Fill cfg from the environment as seen through getenv_fn (secure_getenv in
 * the library, a fake in the tests). Returns the number of bad settings that
 * were reported and replaced by their defaults. */
int sv_config_load(struct sv_config *cfg, sv_getenv_fn getenv_fn);

/* The defaults, as sv_config_load gives with an empty environment. */
void sv_config_defaults(struct sv_config *cfg);

/* The process-wide settings, loaded by the preload's initialiser. */
extern struct sv_config sv_cfg;

/* When an upgrade step begun at `now` gives up (SOVIA_UPGRADE_TIMEOUT_MS). */
static inline uint64_t sv_upgrade_deadline(uint64_t now)
{
	return now + (uint64_t)sv_cfg.upgrade_timeout_ms * 1000u;
}

#endif
