/*
 * tools/launch.h - `embstore launch`: a scheduler, servers and workers on
 * this machine, each with the cluster environment set (docs/deploy.md).
 */
#ifndef EMB_TOOLS_LAUNCH_H
#define EMB_TOOLS_LAUNCH_H

/*
 * Runs `embstore launch` with argv[0] = "launch". Returns the process's
 * exit status: 0 when every worker exited 0, 1 when one failed or a signal
 * stopped the job, 2 for a usage error.
 */
int emb_launch_main(int argc, char **argv);

#endif
