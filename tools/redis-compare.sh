#!/usr/bin/env bash
# tools/redis-compare.sh - the Redis baseline for embstore's pull and push:
# Debian's redis-server on a free loopback port with persistence off, ROWS
# keys of ROW_BYTES-byte values (dim 64 floats = 256 bytes), then MGET and
# MSET of BATCH-key batches drawn Zipf(1.05) and uniform from one client,
# one batch in flight. Prints one line per (op, distribution) with rows/s.
#
# The client is a small C program against hiredis, built here into a temp
# dir: redis-benchmark cannot draw Zipf keys. Installs redis-server,
# redis-tools and libhiredis-dev with apt-get when they are missing (root).
# Nothing leaves the loopback; the server is stopped and the temp dir
# removed on exit, so the script can be rerun at will.
#
#   tools/redis-compare.sh                     # 1M keys, 4096-key batches
#   ROWS=100000 SECONDS_PER_RUN=2 tools/redis-compare.sh
set -euo pipefail

ROWS=${ROWS:-1000000}
BATCH=${BATCH:-4096}
ROW_BYTES=${ROW_BYTES:-256}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
ZIPF_S=${ZIPF_S:-1.05}

need_pkgs=()
command -v redis-server >/dev/null || need_pkgs+=(redis-server)
command -v redis-cli >/dev/null || need_pkgs+=(redis-tools)
[ -f /usr/include/hiredis/hiredis.h ] || need_pkgs+=(libhiredis-dev)
if [ ${#need_pkgs[@]} -gt 0 ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "redis-compare: need ${need_pkgs[*]} (apt-get as root)" >&2
		exit 1
	fi
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		"${need_pkgs[@]}" >/dev/null
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/redis-compare.XXXXXX")
redis_pid=
cleanup() {
	if [ -n "$redis_pid" ]; then
		kill "$redis_pid" 2>/dev/null || true
		wait "$redis_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/rc.c" <<'EOF'
/* MGET/MSET rows/s against one Redis, one batch in flight. */
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng = 42;

static uint64_t next(void)
{
	uint64_t z = (rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	int port = atoi(argv[1]);
	uint64_t rows = strtoull(argv[2], NULL, 10);
	uint32_t batch = (uint32_t)atoi(argv[3]);
	uint32_t row_bytes = (uint32_t)atoi(argv[4]);
	double secs = atof(argv[5]), s = atof(argv[6]);
	redisContext *c = redisConnect("127.0.0.1", port);
	const char **av = malloc((2 * batch + 1) * sizeof(*av));
	size_t *al = malloc((2 * batch + 1) * sizeof(*al));
	uint64_t *keys = malloc(batch * sizeof(*keys));
	double *cdf = malloc(rows * sizeof(*cdf));
	char *val = malloc(row_bytes);
	uint64_t *lat = malloc(sizeof(*lat) << 22);
	double total = 0;

	if (!c || c->err || !av || !al || !keys || !cdf || !val || !lat) {
		fprintf(stderr, "redis-compare: connect: %s\n",
			c ? c->errstr : "no memory");
		return 1;
	}
	memset(val, 0x3c, row_bytes);
	/* Zipf(s) over ranks 1..rows; rank r -> key by a fixed odd
	 * multiplier so hot keys are spread over the key space. */
	for (uint64_t r = 0; r < rows; r++)
		cdf[r] = (total += pow((double)(r + 1), -s));
	for (uint64_t r = 0; r < rows; r++)
		cdf[r] /= total;

	/* Load: MSET in batches. */
	for (uint64_t lo = 0; lo < rows; lo += batch) {
		uint32_t n = rows - lo < batch ? (uint32_t)(rows - lo) : batch;
		redisReply *rep;

		av[0] = "MSET";
		al[0] = 4;
		for (uint32_t i = 0; i < n; i++) {
			keys[i] = lo + i;
			av[1 + 2 * i] = (const char *)&keys[i];
			al[1 + 2 * i] = 8;
			av[2 + 2 * i] = val;
			al[2 + 2 * i] = row_bytes;
		}
		rep = redisCommandArgv(c, 1 + 2 * (int)n, av, al);
		if (!rep || rep->type == REDIS_REPLY_ERROR) {
			fprintf(stderr, "redis-compare: load failed\n");
			return 1;
		}
		freeReplyObject(rep);
	}

	for (int dist = 0; dist < 2; dist++) {
		for (int op = 0; op < 2; op++) {
			uint64_t nb = 0, t_end, deadline, busy = 0;

			deadline = now_ns() + (uint64_t)(secs * 1e9);
			do {
				redisReply *rep;
				uint64_t t0;

				for (uint32_t i = 0; i < batch; i++) {
					if (dist == 0) {
						double u = (double)(next() >> 11) *
							   0x1.0p-53;
						uint64_t lo = 0, hi = rows - 1;

						while (lo < hi) {
							uint64_t m = (lo + hi) / 2;

							if (cdf[m] < u)
								lo = m + 1;
							else
								hi = m;
						}
						keys[i] = lo * 0x9e3779b1ull %
							  rows;
					} else {
						keys[i] = next() % rows;
					}
				}
				av[0] = op == 0 ? "MGET" : "MSET";
				al[0] = 4;
				for (uint32_t i = 0; i < batch; i++) {
					if (op == 0) {
						av[1 + i] = (const char *)&keys[i];
						al[1 + i] = 8;
					} else {
						av[1 + 2 * i] =
							(const char *)&keys[i];
						al[1 + 2 * i] = 8;
						av[2 + 2 * i] = val;
						al[2 + 2 * i] = row_bytes;
					}
				}
				t0 = now_ns();
				rep = redisCommandArgv(
					c, 1 + (op == 0 ? 1 : 2) * (int)batch,
					av, al);
				t_end = now_ns();
				if (!rep || rep->type == REDIS_REPLY_ERROR ||
				    (op == 0 && rep->elements != batch)) {
					fprintf(stderr, "redis-compare: %s "
						"failed\n", av[0]);
					return 1;
				}
				if (op == 0)
					for (size_t i = 0; i < rep->elements;
					     i++)
						if (rep->element[i]->len !=
						    row_bytes) {
							fprintf(stderr,
								"redis-compare: "
								"missing key\n");
							return 1;
						}
				freeReplyObject(rep);
				if (nb < (1u << 22))
					lat[nb] = t_end - t0;
				busy += t_end - t0;
				nb++;
			} while (t_end < deadline);
			{
				uint64_t m = nb < (1u << 22) ? nb : 1u << 22;
				double r = (double)nb * batch / (busy / 1e9);

				qsort(lat, m, sizeof(*lat), cmp_u64);
				printf("redis %s dist=%s batch=%u row_bytes=%u "
				       "batches=%" PRIu64 " rows_per_s=%.0f "
				       "MB_per_s=%.1f p50_us=%.1f p99_us=%.1f\n",
				       op == 0 ? "mget" : "mset",
				       dist == 0 ? "zipf" : "uniform", batch,
				       row_bytes, nb, r, r * row_bytes / 1e6,
				       lat[m / 2] / 1e3,
				       lat[m * 99 / 100] / 1e3);
				fflush(stdout);
			}
		}
	}
	redisFree(c);
	return 0;
}
EOF
cc -O2 -o "$work/rc" "$work/rc.c" -lhiredis -lm

# A free loopback port: redis-server exits at once if the port is taken.
for try in 1 2 3 4 5 6 7 8; do
	port=$((20000 + RANDOM % 30000))
	redis-server --bind 127.0.0.1 --port "$port" --save '' \
		--appendonly no --protected-mode yes --daemonize no \
		--dir "$work" --logfile "$work/redis.log" &
	redis_pid=$!
	for _ in $(seq 1 50); do
		if redis-cli -p "$port" ping 2>/dev/null | grep -q PONG; then
			break 2
		fi
		kill -0 "$redis_pid" 2>/dev/null || break
		sleep 0.1
	done
	kill "$redis_pid" 2>/dev/null || true
	wait "$redis_pid" 2>/dev/null || true
	redis_pid=
done
if [ -z "$redis_pid" ]; then
	echo "redis-compare: could not start redis-server" >&2
	exit 1
fi
echo "# $(redis-server --version | head -1)"
echo "# 127.0.0.1:$port rows=$ROWS batch=$BATCH row_bytes=$ROW_BYTES" \
	"seconds=$SECONDS_PER_RUN zipf_s=$ZIPF_S"
"$work/rc" "$port" "$ROWS" "$BATCH" "$ROW_BYTES" "$SECONDS_PER_RUN" "$ZIPF_S"
echo "# redis used_memory: $(redis-cli -p "$port" info memory |
	sed -n 's/^used_memory_human:\(.*\)\r$/\1/p')"
