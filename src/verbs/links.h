/* This host's links to RDMA peers: whether a TCP connection runs between
 * an address of an RDMA device's netdev (RoCE) or of an IPoIB interface,
 * and a peer on that address's own network (within its prefix). Only
 * such a peer can be asked to wait for RDMA on a first contact: a client
 * from elsewhere never reaches us over a QP. */
#ifndef SV_LINKS_H
#define SV_LINKS_H

#include <stdbool.h>
#include <sys/socket.h>

bool sv_links_on_rdma(const struct sockaddr_storage *local, const struct sockaddr_storage *peer);

#endif
