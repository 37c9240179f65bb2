#include "config.h"

#include "log.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct sv_config sv_cfg;

struct setting {
	struct sv_setting_desc d;
	size_t offset;
};

/* One row: name, kind, field, default, minimum, maximum, what it is. */
#define ROW(name, kind, field, def, min, max, what)                                       \
	{{name, what, SV_SETTING_##kind, def, min, max}, offsetof(struct sv_config, field)}

static const struct setting settings[] = {
	ROW("SOVIA_DISABLE", BOOL, disable, 0, 0, 1, "turn acceleration off"),
	ROW("SOVIA_LOG", LEVEL, log_level, SV_LOG_WARN, SV_LOG_ERROR, SV_LOG_DEBUG,
	 "log level (error, warn, info, debug)"),
	ROW("SOVIA_STATS", BOOL, stats, 0, 0, 1, "print statistics at exit"),
	ROW("SOVIA_WINDOW", COUNT, window, 8, 4, SV_WINDOW_MAX, "receive descriptors (credits)"),
	ROW("SOVIA_BUF_SIZE", BYTES, buf_size, 131072, 1024, 1u << 20,
	 "payload bytes per message (a descriptor holds these and the 24-byte header)"),
	ROW("SOVIA_BUF_START", BYTES, buf_start, 1024, 1024, 1u << 20,
	 "payload bytes per message while a connection is new: its buffers grow to "
	 "SOVIA_BUF_SIZE when the traffic fills them (if that is a power of two; "
	 "SOVIA_BUF_SIZE or more: they never grow)"),
	ROW("SOVIA_BUF_IDLE_MS", COUNT, buf_idle_ms, 1000, 0, 3600000,
	 "milliseconds a connection's sending is idle before the peer's grown buffers go back "
	 "to SOVIA_BUF_START, and its own send buffers with them (0: never)"),
	ROW("SOVIA_ACK_DELAY", COUNT, ack_delay, 2, 1, 512,
	 "consumed descriptors before an ACK"),
	ROW("SOVIA_ACK_TIMEOUT_US", COUNT, ack_timeout_us, 1000, 10, 1000000,
	 "delayed-ACK timer in microseconds"),
	ROW("SOVIA_COALESCE", BOOL, coalesce, 1, 0, 1, "coalesce small writes"),
	ROW("SOVIA_COALESCE_SIZE", BYTES, coalesce_size, 131072, 64, 1u << 20,
	 "write size from which a write is not coalesced, in bytes"),
	ROW("SOVIA_COALESCE_TIMEOUT_US", COUNT, coalesce_timeout_us, 2000, 1, 1000000,
	 "coalescing timer in microseconds"),
	ROW("SOVIA_REG_THRESHOLD", BYTES, reg_threshold, 524288, 1024, 1u << 30,
	 "write size from which data is sent zero-copy"),
	ROW("SOVIA_UPGRADE_TIMEOUT_MS", COUNT, upgrade_timeout_ms, 10000, 10, 600000,
	 "bound on the RDMA upgrade of one connection in milliseconds"),
	ROW("SOVIA_UPGRADE_DELAY_MS", COUNT, upgrade_delay_ms, 10, 0, 600000,
	 "milliseconds a new client connection runs on TCP before its RDMA upgrade starts"),
	ROW("SOVIA_PEER_HOLD_MS", COUNT, peer_hold_ms, 2000, 0, 60000,
	 "the longest a new connection with a host known to speak libsovia holds its first "
	 "writes for its RDMA connection, in milliseconds (0: never)"),
	ROW("SOVIA_SPIN_US", COUNT, spin_us, 4000, 0, 1000000,
	 "the longest a wait polls before it sleeps, in microseconds (it adapts below)"),
	ROW("SOVIA_PRIVILEGED_PORTS", BOOL, privileged_ports, 0, 0, 1,
	 "upgrade a client's connection only when the server's port is below 1024, where "
	 "rdma_cm lets only a privileged process listen: no other user on the server's host "
	 "can answer for the server"),
	ROW("SOVIA_WARDEN_PORT", COUNT, warden_port, SV_WARDEN_PORT, 0, 1023,
	 "the rdma_cm port (below 1024, so only a privileged process can listen there) of "
	 "sovia-warden on the server's host, which a client asks where the server's libsovia "
	 "listens; a host without one is asked directly (0: never ask a warden)"),
	ROW("SOVIA_WARDEN_REQUIRED", BOOL, warden_required, 0, 0, 1,
	 "upgrade a client's connection only when sovia-warden on the server's host vouches "
	 "for the server's RDMA listener: no other user on that host can answer for the "
	 "server, whatever its port"),
	ROW("SOVIA_FORK_KEEP", BOOL, fork_keep, 1, 0, 1,
	 "a fork leaves the parent's connections on RDMA until a child uses its copy of one "
	 "(where the kernel copies pinned pages at a fork); 0: every fork takes them back to "
	 "TCP first"),
	ROW("SOVIA_ASK_AGAIN", BOOL, ask_again, 1, 0, 1,
	 "a client whose server took its connection back to TCP asks at once to move it to "
	 "RDMA again (a server whose fork's child used the connection, once the child is "
	 "gone); 0: it stays on TCP unless the client has its own reason to ask"),
};

static void store(struct sv_config *cfg, const struct setting *s, uint32_t v)
{
	char *p = (char *)cfg + s->offset;
	switch (s->d.kind) {
	case SV_SETTING_BOOL:
		*(bool *)p = v != 0;
		return;
	case SV_SETTING_LEVEL:
		*(int *)p = (int)v;
		return;
	case SV_SETTING_COUNT:
	case SV_SETTING_BYTES:
		*(uint32_t *)p = v;
		return;
	}
}

static int parse_bool(const char *s, uint32_t *out)
{
	static const char *const yes[] = {"1", "yes", "true", "on"};
	static const char *const no[] = {"0", "no", "false", "off"};
	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (strcasecmp(s, yes[i]) == 0) {
			*out = 1;
			return 0;
		}
		if (strcasecmp(s, no[i]) == 0) {
			*out = 0;
			return 0;
		}
	}
	return -EINVAL;
}

static int parse_level(const char *s, uint32_t *out)
{
	static const char *const names[] = {"error", "warn", "info", "debug"};
	for (uint32_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (strcasecmp(s, names[i]) == 0) {
			*out = i;
			return 0;
		}
	}
	if (s[0] >= '0' && s[0] <= '3' && s[1] == '\0') {
		*out = (uint32_t)(s[0] - '0');
		return 0;
	}
	return -EINVAL;
}

static int parse_number(const char *s, bool allow_suffix, uint32_t *out)
{
	if (*s < '0' || *s > '9')
		return -EINVAL; /* no sign, no leading blanks */
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno)
		return -ERANGE;
	unsigned long long mult = 1;
	if (allow_suffix && (*end == 'k' || *end == 'K'))
		mult = 1024, end++;
	else if (allow_suffix && (*end == 'm' || *end == 'M'))
		mult = 1024 * 1024, end++;
	if (*end != '\0')
		return -EINVAL;
	if (v > UINT32_MAX / mult)
		return -ERANGE;
	*out = (uint32_t)(v * mult);
	return 0;
}

static int parse_form(const struct sv_setting_desc *s, const char *text, uint32_t *out)
{
	switch (s->kind) {
	case SV_SETTING_BOOL:
		return parse_bool(text, out);
	case SV_SETTING_LEVEL:
		return parse_level(text, out);
	case SV_SETTING_COUNT:
		return parse_number(text, false, out);
	case SV_SETTING_BYTES:
		return parse_number(text, true, out);
	}
	return -EINVAL;
}

int sv_config_parse(const struct sv_setting_desc *s, const char *text, uint32_t *out)
{
	uint32_t v;
	int rc = parse_form(s, text, &v);
	if (rc < 0)
		return rc;
	if (v < s->min || v > s->max)
		return -ERANGE;
	*out = v;
	return 0;
}

const struct sv_setting_desc *sv_config_setting(size_t i)
{
	return i < sizeof(settings) / sizeof(settings[0]) ? &settings[i].d : NULL;
}

void sv_config_defaults(struct sv_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++)
		store(cfg, &settings[i], settings[i].d.def);
}

int sv_config_load(struct sv_config *cfg, sv_getenv_fn getenv_fn)
{
	int bad = 0;
	sv_config_defaults(cfg);
	for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++) {
		const struct setting *row = &settings[i];
		const struct sv_setting_desc *s = &row->d;
		const char *text = getenv_fn(s->name);
		uint32_t v;
		if (!text)
			continue;
		if (sv_config_parse(s, text, &v) < 0) {
			sv_err("%s='%s' is not a valid %s (%s%u..%u); using the default %u", s->name,
			       text, s->what,
			       s->kind == SV_SETTING_BYTES ? "bytes, k/m suffix allowed, " : "", s->min,
			       s->max, s->def);
			bad++;
			continue;
		}
		store(cfg, row, v);
	}
	/* Relations between settings. The default ACK delay follows a
	 * smaller SOVIA_WINDOW quietly; an explicit one that does not fit is
	 * reported. */
	if (cfg->ack_delay >= cfg->window) {
		uint32_t fixed = cfg->window / 2;
		if (getenv_fn("SOVIA_ACK_DELAY")) {
			sv_err("SOVIA_ACK_DELAY=%u must be below SOVIA_WINDOW=%u (the sender would "
			       "stall); using %u",
			       cfg->ack_delay, cfg->window, fixed);
			bad++;
		}
		cfg->ack_delay = fixed;
	}
	/* Coalesced writes share one message: they must fit its payload. The
	 * default follows a smaller SOVIA_BUF_SIZE quietly; an explicit
	 * setting that does not fit is reported. */
	if (cfg->coalesce_size > cfg->buf_size) {
		if (getenv_fn("SOVIA_COALESCE_SIZE")) {
			sv_err("SOVIA_COALESCE_SIZE=%u does not fit a message's payload "
			       "(SOVIA_BUF_SIZE=%u); using %u",
			       cfg->coalesce_size, cfg->buf_size, cfg->buf_size);
			bad++;
		}
		cfg->coalesce_size = cfg->buf_size;
	}
	return bad;
}
