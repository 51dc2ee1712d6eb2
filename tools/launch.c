#include "launch.h"
int emb_launch_main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	return 2;
}
