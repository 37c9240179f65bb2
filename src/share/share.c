/* The share module's start (share.h). */
#include "share.h"

#include "helper.h"
#include "stream.h"
#include "upgrade.h"

/* Each round of the helper, before it looks at the streams: predecessors
 * whose successors took over are let go first, then copies' claims start
 * their way back (a claim's first step comes before its stream's look). */
static uint64_t copies_round(uint64_t now)
{
	sv_stream_redo_reap();
	return sv_stream_keep_service(now);
}

void sv_share_init(void)
{
	sv_stream_init();
	sv_helper_each_round(SV_HELPER_BEFORE_LOOKS, copies_round);
	/* A request for a connection back on TCP here revives it. */
	sv_upgrade_serve_revive(sv_stream_revive_parked);
}
