/* The upgrade's listeners (upgrade.c), as the interposer uses them, and
 * the helper's calls into the upgrade. */
#ifndef SV_UPGRADE_H
#define SV_UPGRADE_H

#include <stdbool.h>
#include <stdint.h>

struct rdma_event_channel;
struct sv_listener;

/* Server: the application listens on fd; listen for upgrades on the same
 * address and port. NULL when RDMA is not available there (not an error). */
struct sv_listener *sv_upgrade_listen(int fd);
/* In a fork's child, for the parent's listener `parent` on the inherited
 * listening socket fd: a listener of the child's, whose RDMA listener opens
 * at its first accept, on any port, and to which the parent redirects the
 * requests for the connections the child accepts (holders.h). NULL when
 * the parent had none. Only reads the parent's object. */
struct sv_listener *sv_upgrade_listen_inherited(const struct sv_listener *parent, int fd);
/* The application is about to accept on l's socket: an inherited
 * listener opens its RDMA listener now, before the first connection needs
 * it (rdma_cm's start in a fresh process is slow). */
void sv_upgrade_will_accept(struct sv_listener *l);
/* False once it is known that no RDMA listener could be opened. */
bool sv_upgrade_listener_usable(struct sv_listener *l);
void sv_upgrade_unlisten(struct sv_listener *l);

/* Called by the helper when the rdma_cm channel is readable: takes and
 * handles every pending event. */
void sv_upgrade_events(struct rdma_event_channel *ch);
/* Called by the helper on every wake-up: expire pending requests. Returns
 * the next deadline (0 = none). */
uint64_t sv_upgrade_timers(uint64_t now);

/* In a fork's child: the parent's requests and connections are the
 * parent's. */
void sv_upgrade_atfork_child(void);

#endif
