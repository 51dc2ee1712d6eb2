/*
 * tests/cluster/etcd_proc.c - a local etcd for tests (etcd_proc.h).
 */
#include "etcd_proc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
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
#include "common/clock.h"
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

/* ---- a relay that stalls on cue ----------------------------------- */

struct relay {
	struct etcd_stall_proxy *p;
	int cfd, sfd;
};

static bool write_all(int fd, const char *b, size_t n)
{
	while (n) {
		ssize_t w = send(fd, b, n, MSG_NOSIGNAL);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return false;
		b += w;
		n -= (size_t)w;
	}
	return true;
}

/* Whether the n bytes at b contain the NUL-terminated s. */
static bool has(const char *b, size_t n, const char *s)
{
	return memmem(b, n, s, strlen(s)) != NULL;
}

/* What a client sends: a request seen after the cue starts the stall;
 * every byte waits out a stall under way. */
static bool client_bytes(struct etcd_stall_proxy *p, int sfd, const char *b,
			 size_t n)
{
	if (has(b, n, "POST ") &&
	    __atomic_load_n(&p->armed, __ATOMIC_SEQ_CST) &&
	    !__atomic_exchange_n(&p->fired, 1, __ATOMIC_SEQ_CST))
		__atomic_store_n(&p->until_ms,
				 (int64_t)emb_clock_ms() + p->stall_ms,
				 __ATOMIC_SEQ_CST);
	if (has(b, n, p->after))
		__atomic_store_n(&p->armed, 1, __ATOMIC_SEQ_CST);
	while ((int64_t)emb_clock_ms() <
		   __atomic_load_n(&p->until_ms, __ATOMIC_SEQ_CST) &&
	       !__atomic_load_n(&p->stop, __ATOMIC_SEQ_CST)) {
		struct timespec ts = {0, 10 * 1000000};

		nanosleep(&ts, NULL);
	}
	return write_all(sfd, b, n);
}

static void *relay_main(void *arg)
{
	struct relay *r = arg;
	struct etcd_stall_proxy *p = r->p;
	char buf[16384];

	while (!__atomic_load_n(&p->stop, __ATOMIC_SEQ_CST)) {
		struct pollfd pf[2] = {{r->cfd, POLLIN, 0},
				       {r->sfd, POLLIN, 0}};
		int n = poll(pf, 2, 100);
		ssize_t got;

		if (n < 0 && errno != EINTR)
			break;
		if (n <= 0)
			continue;
		if (pf[0].revents) {
			got = recv(r->cfd, buf, sizeof(buf), 0);
			if (got <= 0 ||
			    !client_bytes(p, r->sfd, buf, (size_t)got))
				break;
		}
		if (pf[1].revents) {
			got = recv(r->sfd, buf, sizeof(buf), 0);
			if (got <= 0 || !write_all(r->cfd, buf, (size_t)got))
				break;
		}
	}
	close(r->cfd);
	close(r->sfd);
	free(r);
	__atomic_sub_fetch(&p->nconn, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

static int connect_local(uint16_t port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		close(fd);
		fd = -1;
	}
	return fd;
}

static void *accept_main(void *arg)
{
	struct etcd_stall_proxy *p = arg;

	while (!__atomic_load_n(&p->stop, __ATOMIC_SEQ_CST)) {
		struct pollfd pf = {p->lfd, POLLIN, 0};
		struct relay *r;
		pthread_t th;
		int cfd;

		if (poll(&pf, 1, 100) <= 0)
			continue;
		cfd = accept(p->lfd, NULL, NULL);
		if (cfd < 0)
			continue;
		r = malloc(sizeof(*r));
		if (!r) {
			close(cfd);
			continue;
		}
		r->p = p;
		r->cfd = cfd;
		r->sfd = connect_local(p->etcd_port);
		if (r->sfd < 0) {
			close(cfd);
			free(r);
			continue;
		}
		__atomic_add_fetch(&p->nconn, 1, __ATOMIC_SEQ_CST);
		if (pthread_create(&th, NULL, relay_main, r)) {
			__atomic_sub_fetch(&p->nconn, 1, __ATOMIC_SEQ_CST);
			close(r->sfd);
			close(cfd);
			free(r);
			continue;
		}
		pthread_detach(th);
	}
	return NULL;
}

int etcd_stall_proxy_start(struct etcd_stall_proxy *p)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t len = sizeof(a);

	p->stop = p->armed = p->fired = p->nconn = 0;
	p->until_ms = 0;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	p->lfd = socket(AF_INET, SOCK_STREAM, 0);
	if (p->lfd < 0)
		return -1;
	if (bind(p->lfd, (struct sockaddr *)&a, sizeof(a)) ||
	    getsockname(p->lfd, (struct sockaddr *)&a, &len) ||
	    listen(p->lfd, 16) ||
	    pthread_create(&p->thread, NULL, accept_main, p)) {
		close(p->lfd);
		return -1;
	}
	p->port = ntohs(a.sin_port);
	snprintf(p->url, sizeof(p->url), "etcd://127.0.0.1:%u", p->port);
	return 0;
}

void etcd_stall_proxy_stop(struct etcd_stall_proxy *p)
{
	__atomic_store_n(&p->stop, 1, __ATOMIC_SEQ_CST);
	pthread_join(p->thread, NULL);
	close(p->lfd);
	/* The relays see stop within their 100 ms poll. */
	while (__atomic_load_n(&p->nconn, __ATOMIC_SEQ_CST)) {
		struct timespec ts = {0, 10 * 1000000};

		nanosleep(&ts, NULL);
	}
}
