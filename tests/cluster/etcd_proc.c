/*
 * tests/cluster/etcd_proc.c - a local etcd for tests (etcd_proc.h).
 */
#include "etcd_proc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cluster/etcd.h"
#include "harness.h"

static const char *etcd_bin(void)
{
	const char *b = getenv("EMB_ETCD_BIN");

	return b && *b ? b : "etcd";
}

bool etcd_proc_available(void)
{
	const char *b = etcd_bin();
	const char *path = getenv("PATH");
	char buf[4096];

	if (strchr(b, '/'))
		return access(b, X_OK) == 0;
	while (path && *path) {
		const char *end = strchr(path, ':');
		size_t n = end ? (size_t)(end - path) : strlen(path);

		snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, path, b);
		if (access(buf, X_OK) == 0)
			return true;
		path = end ? end + 1 : NULL;
	}
	return false;
}

uint16_t etcd_proc_free_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	uint16_t port = 0;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

static void print_log(const struct etcd_proc *p)
{
	char path[512], line[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/etcd.log", p->dir);
	f = fopen(path, "r");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		fprintf(stderr, "etcd: %s", line);
	fclose(f);
}

int etcd_proc_start(struct etcd_proc *p)
{
	char client[64], peer[64], cluster[96], data[512], log[512];
	struct emb_etcd_opts eo = {0};
	struct emb_etcd *e;
	int rc = -1;

	memset(p, 0, sizeof(*p));
	p->dir = emb_test_shmdir();
	p->port = etcd_proc_free_port();
	p->peer_port = etcd_proc_free_port();
	if (!p->dir || !p->port || !p->peer_port || p->port == p->peer_port)
		return -1;
	snprintf(client, sizeof(client), "http://127.0.0.1:%u", p->port);
	snprintf(peer, sizeof(peer), "http://127.0.0.1:%u", p->peer_port);
	snprintf(cluster, sizeof(cluster), "default=%s", peer);
	snprintf(data, sizeof(data), "%s/data", p->dir);
	snprintf(log, sizeof(log), "%s/etcd.log", p->dir);
	snprintf(p->url, sizeof(p->url), "etcd://127.0.0.1:%u", p->port);
	p->pid = fork();
	if (p->pid < 0)
		return -1;
	if (p->pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		/* A test that crashes or is killed takes its etcd with it,
		 * rather than leave it serving on the machine. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);

		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execlp(etcd_bin(), etcd_bin(), "--name", "default",
		       "--data-dir", data, "--listen-client-urls", client,
		       "--advertise-client-urls", client,
		       "--listen-peer-urls", peer,
		       "--initial-advertise-peer-urls", peer,
		       "--initial-cluster", cluster, (char *)NULL);
		_exit(127);
	}
	eo.endpoints = p->url;
	eo.timeout_ms = 1000;
	if (emb_etcd_create(&eo, &e))
		goto fail;
	/* 20 s at most, whatever each try costs. */
	for (time_t end = time(NULL) + 20; rc && time(NULL) < end;) {
		struct emb_etcd_range r;
		struct timespec ts = {0, 100 * 1000000};

		if (emb_etcd_get(e, "/probe", false, true, &r) == 0) {
			emb_etcd_range_free(&r);
			rc = 0;
			break;
		}
		if (waitpid(p->pid, NULL, WNOHANG) == p->pid) {
			p->pid = 0;
			break;
		}
		nanosleep(&ts, NULL);
	}
	emb_etcd_destroy(e);
	if (rc == 0)
		return 0;
fail:
	fprintf(stderr, "etcd on port %u did not come up\n", p->port);
	print_log(p);
	etcd_proc_stop(p);
	return -1;
}

void etcd_proc_stop(struct etcd_proc *p)
{
	if (p->pid > 0) {
		kill(p->pid, SIGTERM);
		for (int i = 0; i < 100; i++) {
			struct timespec ts = {0, 50 * 1000000};

			if (waitpid(p->pid, NULL, WNOHANG) == p->pid) {
				p->pid = 0;
				break;
			}
			nanosleep(&ts, NULL);
		}
		if (p->pid > 0) {
			kill(p->pid, SIGKILL);
			waitpid(p->pid, NULL, 0);
		}
		p->pid = 0;
	}
	if (p->dir) {
		emb_test_rmtree(p->dir);
		free(p->dir);
		p->dir = NULL;
	}
}
