/*
 * tools/echo-client.c - the blocking client for embstore-echo-server (see
 * echo-server.c for the wire): one connection, one request in flight, each
 * a batch of --batch ids drawn uniform from [0, --rows), timed around the
 * send and the full receive. Prints rows/s, bytes/s and batch latency:
 * the loopback ceiling that embstore's pull is compared against.
 *
 * Single-threaded.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/addr.h"
#include "common/clock.h"
#include "common/hist.h"
#include "common/seconds.h"

#define BATCH_MAX (1u << 20)

static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static int io_full(int fd, void *buf, size_t len, bool out)
{
	char *p = buf;

	while (len) {
		ssize_t n = out ? send(fd, p, len, MSG_NOSIGNAL)
				: recv(fd, p, len, 0);

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

static void usage(FILE *f)
{
	fprintf(f, "usage: embstore-echo-client --connect HOST:PORT "
		   "[--batch 4096] [--row-bytes 256] [--rows N] "
		   "[--seconds 5]\n");
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"connect", required_argument, NULL, 'c'},
		{"batch", required_argument, NULL, 'b'},
		{"row-bytes", required_argument, NULL, 'r'},
		{"rows", required_argument, NULL, 'n'},
		{"seconds", required_argument, NULL, 's'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},
		{NULL, 0, NULL, 0},
	};
	struct sockaddr_in sa = {.sin_family = AF_INET};
	const char *connect_to = NULL;
	struct emb_addr addr;
	uint32_t batch = 4096, row_bytes = 256;
	uint64_t rows = 1u << 20, rng = 1, batches = 0, start, end, deadline;
	uint64_t ms = 5000;
	struct emb_hist *h;
	uint8_t *req, *resp;
	int one = 1, fd, c;

	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'c': connect_to = optarg; break;
		case 'b': batch = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'r': row_bytes = (uint32_t)strtoul(optarg, NULL, 10);
			  break;
		case 'n': rows = strtoull(optarg, NULL, 10); break;
		case 's':
			if (emb_seconds_parse(optarg, 1, 86400000, &ms)) {
				fprintf(stderr,
					"embstore-echo-client: bad --seconds "
					"'%s'\n",
					optarg);
				return 2;
			}
			break;
		case 'h': usage(stdout); return 0;
		case 'V':
			printf("embstore-echo-client %s\n", EMB_VERSION);
			return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!connect_to ||
	    emb_addr_parse(connect_to, strlen(connect_to), -1, &addr) ||
	    batch == 0 || batch > BATCH_MAX || row_bytes == 0 ||
	    row_bytes > 65536 || rows == 0) {
		usage(stderr);
		return 2;
	}
	sa.sin_port = htons(addr.port);
	if (inet_pton(AF_INET, addr.host, &sa.sin_addr) != 1) {
		fprintf(stderr, "embstore-echo-client: bad address %s\n",
			addr.host);
		return 2;
	}
	h = malloc(sizeof(*h));
	req = malloc(8 + (size_t)batch * 8);
	resp = malloc((size_t)batch * row_bytes);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (!h || !req || !resp || fd < 0 ||
	    connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		perror("embstore-echo-client: connect");
		return 1;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	memcpy(req, &batch, 4);
	memset(req + 4, 0, 4);
	emb_hist_reset(h);

	start = emb_clock_ns();
	deadline = start + ms * 1000000;
	do {
		uint64_t t0;

		/* Ids are drawn outside the clock, as embstore-bench does. */
		for (uint32_t i = 0; i < batch; i++) {
			uint64_t id = splitmix(&rng) % rows;

			memcpy(req + 8 + (size_t)i * 8, &id, 8);
		}
		t0 = emb_clock_ns();
		if (io_full(fd, req, 8 + (size_t)batch * 8, true) ||
		    io_full(fd, resp, (size_t)batch * row_bytes, false)) {
			perror("embstore-echo-client: round trip");
			return 1;
		}
		end = emb_clock_ns();
		emb_hist_record(h, end - t0);
		batches++;
	} while (end < deadline);

	{
		double busy_s = (double)h->sum / 1e9;
		double r = (double)batches * batch / busy_s;

		printf("echo batch=%" PRIu32 " row_bytes=%" PRIu32
		       " batches=%" PRIu64 " rows_per_s=%.0f MB_per_s=%.1f"
		       " p50_us=%.1f p99_us=%.1f\n",
		       batch, row_bytes, batches, r, r * row_bytes / 1e6,
		       (double)emb_hist_percentile(h, 50) / 1e3,
		       (double)emb_hist_percentile(h, 99) / 1e3);
	}
	close(fd);
	free(resp);
	free(req);
	free(h);
	return 0;
}
