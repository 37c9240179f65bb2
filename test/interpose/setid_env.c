/* What libsovia's settings are in this process, once its constructor ran
 * (the preload's objects are linked in, as an /etc/ld.so.preload module
 * is loaded into a set-id program): test/secure_env.sh runs it set-id. */
#include "config.h"

#include <stdio.h>

int main(void)
{
	printf("warden_port=%u disable=%d\n", (unsigned)sv_cfg.warden_port, (int)sv_cfg.disable);
	return 0;
}
