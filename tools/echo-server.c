/*
 * tools/echo-server.c - the physical ceiling for a pull over TCP: a trivial
 * server that answers each request of n u64 ids with n rows of row_bytes
 * bytes, so the network path's figures can be judged against what the
 * kernel and loopback allow with no table, no decode and no event loop.
 *
 * Wire (both directions little-endian, no versioning: a benchmark only):
 *   request   u32 n, u32 0, then n u64 ids        (4096 ids = 32 KiB)
 *   response  n * row_bytes bytes                  (4096 x 256 = 1 MiB)
 * By default the response is the same static buffer every time (an echo of
 * the right size); with --gather the rows are copied by id out of a table
 * of --rows rows first, as a server without an index would.
 *
 * Threads: main accepts; each connection gets a detached thread with its
 * own buffers, which only reads the shared table. Runs until killed.
 */
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define BATCH_MAX (1u << 20)

struct cfg {
	uint32_t row_bytes;	/* bytes per row in a response */
	uint64_t rows;		/* table rows with --gather */
	bool gather;		/* copy rows by id instead of a static echo */
	uint8_t *table;		/* rows * row_bytes, read-only once serving */
};

struct conn {
	const struct cfg *cfg;	/* shared, read-only */
	int fd;			/* owned */
};

static int read_full(int fd, void *buf, size_t len)
{
	char *p = buf;

	while (len) {
		ssize_t n = recv(fd, p, len, 0);

		if (n == 0)
			return -EPIPE;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static int write_full(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static void *conn_main(void *arg)
{
	struct conn *cn = arg;
	const struct cfg *cfg = cn->cfg;
	uint64_t *ids = malloc((size_t)BATCH_MAX * sizeof(*ids));
	uint8_t *out = calloc(BATCH_MAX, cfg->row_bytes);
	uint32_t head[2];

	if (!ids || !out)
		goto out;
	/* The static echo: recognisable bytes, the same every time. */
	for (size_t i = 0; !cfg->gather && i < (size_t)BATCH_MAX * cfg->row_bytes;
	     i += 4096)
		out[i] = (uint8_t)(i >> 12);
	while (read_full(cn->fd, head, sizeof(head)) == 0) {
		uint32_t n = head[0];

		if (n == 0 || n > BATCH_MAX ||
		    read_full(cn->fd, ids, (size_t)n * sizeof(*ids)))
			break;
		if (cfg->gather)
			for (uint32_t i = 0; i < n; i++)
				memcpy(out + (size_t)i * cfg->row_bytes,
				       cfg->table + ids[i] % cfg->rows *
							    cfg->row_bytes,
				       cfg->row_bytes);
		if (write_full(cn->fd, out, (size_t)n * cfg->row_bytes))
			break;
	}
out:
	close(cn->fd);
	free(out);
	free(ids);
	free(cn);
	return NULL;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: embstore-echo-server [--listen HOST:PORT] "
		   "[--row-bytes N] [--gather] [--rows N]\n"
		   "  prints \"listening on HOST:PORT\" once bound "
		   "(port 0 picks one)\n");
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"listen", required_argument, NULL, 'l'},
		{"row-bytes", required_argument, NULL, 'r'},
		{"rows", required_argument, NULL, 'n'},
		{"gather", no_argument, NULL, 'g'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},
		{NULL, 0, NULL, 0},
	};
	struct cfg cfg = {.row_bytes = 256, .rows = 1u << 20};
	struct sockaddr_in sa = {.sin_family = AF_INET};
	const char *listen_at = "127.0.0.1:7180";
	socklen_t slen = sizeof(sa);
	char host[64];
	const char *colon;
	int one = 1, lfd, c;

	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'l': listen_at = optarg; break;
		case 'r': cfg.row_bytes = (uint32_t)strtoul(optarg, NULL, 10);
			  break;
		case 'n': cfg.rows = strtoull(optarg, NULL, 10); break;
		case 'g': cfg.gather = true; break;
		case 'h': usage(stdout); return 0;
		case 'V':
			printf("embstore-echo-server %s\n", EMB_VERSION);
			return 0;
		default: usage(stderr); return 2;
		}
	}
	colon = strrchr(listen_at, ':');
	if (!colon || (size_t)(colon - listen_at) >= sizeof(host) ||
	    cfg.row_bytes == 0 || cfg.row_bytes > 65536 || cfg.rows == 0) {
		usage(stderr);
		return 2;
	}
	memcpy(host, listen_at, (size_t)(colon - listen_at));
	host[colon - listen_at] = '\0';
	sa.sin_port = htons((uint16_t)strtoul(colon + 1, NULL, 10));
	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
		fprintf(stderr, "embstore-echo-server: bad address %s\n", host);
		return 2;
	}
	if (cfg.gather) {
		cfg.table = malloc(cfg.rows * cfg.row_bytes);
		if (!cfg.table) {
			fprintf(stderr, "embstore-echo-server: no memory for "
					"the table\n");
			return 1;
		}
		for (uint64_t i = 0; i < cfg.rows * cfg.row_bytes; i++)
			cfg.table[i] = (uint8_t)(i * 31 >> 8);
	}
	signal(SIGPIPE, SIG_IGN);
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 ||
	    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(lfd, 64) ||
	    getsockname(lfd, (struct sockaddr *)&sa, &slen)) {
		perror("embstore-echo-server: listen");
		return 1;
	}
	printf("listening on %s:%u\n", host, ntohs(sa.sin_port));
	fflush(stdout);
	for (;;) {
		struct conn *cn;
		pthread_t t;
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			perror("embstore-echo-server: accept");
			return 1;
		}
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		cn = malloc(sizeof(*cn));
		if (!cn) {
			close(fd);
			continue;
		}
		*cn = (struct conn){.cfg = &cfg, .fd = fd};
		if (pthread_create(&t, NULL, conn_main, cn)) {
			close(fd);
			free(cn);
			continue;
		}
		pthread_detach(t);
	}
}
