#!/bin/bash
# In-bed check: the rxe device sovia-bed announced exists and its port is
# PORT_ACTIVE with an Ethernet (RoCE) link layer.
set -euo pipefail
dev=${SOVIA_BED_DEV:?SOVIA_BED_DEV not set: run me under test/bed/sovia-bed}
out=$(ibv_devinfo -d "$dev") || { echo "FAIL: ibv_devinfo -d $dev failed" >&2; exit 1; }
echo "$out"
grep -Eq "^hca_id:[[:space:]]+$dev\$" <<<"$out" || { echo "FAIL: $dev not listed" >&2; exit 1; }
grep -Eq 'state:[[:space:]]+PORT_ACTIVE' <<<"$out" || { echo "FAIL: $dev port not PORT_ACTIVE" >&2; exit 1; }
grep -Eq 'link_layer:[[:space:]]+Ethernet' <<<"$out" || { echo "FAIL: $dev link layer not Ethernet" >&2; exit 1; }
echo "PASS: $dev PORT_ACTIVE (${SOVIA_BED_MODE:-?} mode, ip ${SOVIA_BED_IP:-?})"
