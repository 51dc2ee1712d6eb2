/*
 * tools/embstore/stat.c - `embstore stat`: one line per server and table with
 * rows, memory and op rates.
 *
 *   embstore stat --servers LIST [--interval S] [--watch N] [--json]
 *
 * Rates come from two STATS samples (emb_client_server_stats) a known time
 * apart: the counters are totals since the table was created, so only a
 * difference says what a table does now. Without --watch it samples twice
 * one interval apart (default 1 s) and prints once; --watch N samples every
 * N seconds and redraws in place (ANSI home + clear when stdout is a
 * terminal, plain successive tables otherwise) until Ctrl-C, which exits 0.
 * Single-threaded; the client library runs its own network thread.
 */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cluster/coord.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/seconds.h"
#include "common/token.h"
#include "proto/wire.h"
#include "worker/embstore.h"

#define MAX_SERVERS 256u
#define HOLDERS_MAX 8u /* copies of a slot (EMB_REPLICAS) at most */

/* One sample of every table on every server. */
struct sample {
	struct emb_client_server_table *t; /* n entries, malloc'd */
	uint32_t n;			   /* entries */
	double at_s;			   /* CLOCK_MONOTONIC, seconds */
	int err[MAX_SERVERS]; /* why server s gave nothing (0: it answered) */
	uint32_t nerr;	      /* servers with err set */
};

static volatile sig_atomic_t stop_flag;

static void on_sigint(int sig)
{
	(void)sig;
	stop_flag = 1;
}

/* Sleeps s seconds in short steps, so Ctrl-C ends it at once. */
static void nap(double s)
{
	double until = emb_clock_s() + s;

	while (!stop_flag && emb_clock_s() < until) {
		struct timespec ts = {0, 50 * 1000 * 1000};

		nanosleep(&ts, NULL);
	}
}

/* Reads every table of every server into *out (which it frees first). A
 * job's trouble is when an operator runs this, so a server that cannot be
 * read does not hide the others: its error goes to out->err. Fails only
 * when no server answered. */
static int take(struct emb_client *c, struct sample *out)
{
	uint32_t cap = out->n + 16;

	for (;;) {
		struct emb_client_server_table *t = calloc(cap, sizeof(*t));
		int n;

		if (!t)
			return -ENOMEM;
		t[0].struct_size = sizeof(*t); /* the entries' stride */
		n = emb_client_server_stats_each(c, t, cap, out->err,
						 MAX_SERVERS);
		if (n < 0) {
			free(t);
			return n;
		}
		if ((uint32_t)n <= cap) {
			free(out->t);
			out->t = t;
			out->n = (uint32_t)n;
			out->nerr = 0;
			for (uint32_t s = 0; s < MAX_SERVERS; s++)
				out->nerr += out->err[s] != 0;
			out->at_s = emb_clock_s();
			return 0;
		}
		free(t); /* tables appeared meanwhile: ask with more room */
		cap = (uint32_t)n + 16;
	}
}

static const struct emb_client_server_table *
find(const struct sample *s, uint32_t server, const char *name)
{
	for (uint32_t i = 0; i < s->n; i++)
		if (s->t[i].server == server && !strcmp(s->t[i].name, name))
			return &s->t[i];
	return NULL;
}

/* 1536 -> "1.5 KiB": memory in binary units. */
static void fmt_bytes(char *buf, size_t cap, uint64_t v)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double d = (double)v;
	int u = 0;

	while (d >= 1024 && u < 4) {
		d /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, cap, "%llu B", (unsigned long long)v);
	else
		snprintf(buf, cap, "%.1f %s", d, units[u]);
}

/* 1234567 -> "1.23M": counts and rates in decimal units. */
static void fmt_count(char *buf, size_t cap, double v)
{
	/* Small rates keep a decimal (0.5 pushes/s); counts never need one. */
	bool whole = v == (double)(uint64_t)v;

	if (v < 100 && !whole)
		snprintf(buf, cap, "%.1f", v);
	else if (v < 10000)
		snprintf(buf, cap, "%.0f", v);
	else if (v < 1e6)
		snprintf(buf, cap, "%.1fk", v / 1e3);
	else if (v < 1e9)
		snprintf(buf, cap, "%.2fM", v / 1e6);
	else
		snprintf(buf, cap, "%.2fG", v / 1e9);
}

/* The counter's growth per second between a and b; 0 for a new table or
 * a counter that went back (the table was dropped and made again). */
static double rate(uint64_t a, uint64_t b, double dt)
{
	return b >= a && dt > 0 ? (double)(b - a) / dt : 0;
}

static void print_row(const char *server, const char *table, uint32_t dim,
		      const char *fmt, uint64_t rows, uint64_t bytes,
		      const double r[4])
{
	char rs[16], bs[16], p[16], q[16], rp[16], rq[16];

	fmt_count(rs, sizeof(rs), (double)rows);
	fmt_bytes(bs, sizeof(bs), bytes);
	fmt_count(p, sizeof(p), r[0]);
	fmt_count(q, sizeof(q), r[1]);
	fmt_count(rp, sizeof(rp), r[2]);
	fmt_count(rq, sizeof(rq), r[3]);
	if (dim)
		printf("%-21s %-16s %5u %-4s %9s %10s %9s %9s %11s %11s\n",
		       server, table, dim, fmt, rs, bs, p, q, rp, rq);
	else
		printf("%-21s %-16s %5s %-4s %9s %10s %9s %9s %11s %11s\n",
		       server, table, "", "", rs, bs, p, q, rp, rq);
}

/* s as a JSON string: quotes, backslashes and control bytes escaped. */
static void json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			printf("\\%c", ch);
		else if (ch < 0x20)
			printf("\\u%04x", ch);
		else
			putchar(ch);
	}
	putchar('"');
}

/* With --sched: the scheduler, for what it moves (moves_get()); with
 * --coordinator, etcd and the job. */
static const char *g_sched, *g_coord, *g_job;
static const uint8_t *g_token;
static uint32_t g_token_len;

static const char *const move_kinds[] = {"none", "join", "drain",
					 "recovery"};
static const char *const move_phases[] = {"none", "copy ahead", "fenced"};

/* What the scheduler or the job in etcd moves now; false without
 * --sched or --coordinator, or without an answer (a scheduler too old to
 * tell is not an error: nothing is shown). */
static bool moves_get(struct emb_cluster_moves *m)
{
	int rc = -EINVAL;

	*m = EMB_SIZED(struct emb_cluster_moves);
	if (g_sched)
		rc = emb_cluster_moves(g_sched, g_token, g_token_len, m);
	else if (g_coord)
		rc = emb_coordinator_moves(g_coord, g_job, m);
	return rc == 0 && m->kind <= EMB_MOVE_RECOVERY && m->phase <= 2;
}

/* The moves as one line of text: "moves: none", or the drain, join or
 * recovery, its chunk and its progress. */
static void moves_text(void)
{
	struct emb_cluster_moves m;

	if (!moves_get(&m))
		return;
	if (m.kind == EMB_MOVE_NONE) {
		printf("moves: none\n\n");
		return;
	}
	printf("moves: %s of server %u", move_kinds[m.kind], m.rank);
	if (m.n)
		printf(": slots %u-%u %s to server %u", m.first,
		       m.first + m.n - 1,
		       m.phase == 1 ? "copied ahead" : "fenced, streamed",
		       m.to);
	if (m.kind == EMB_MOVE_RECOVERY && m.elapsed_ms)
		printf("; %.1f s", (double)m.elapsed_ms / 1e3);
	else if (m.kind != EMB_MOVE_RECOVERY)
		printf("; %u slots moved in %.1f s, %u to go", m.moved,
		       (double)m.elapsed_ms / 1e3, m.left);
	if (m.eta_ms >= 0)
		printf(", about %.0f s left", (double)m.eta_ms / 1e3);
	if (m.rows) {
		/* What the sources streamed, and at what rate. */
		char r[16], b[16], bs[16];

		fmt_count(r, sizeof(r), (double)m.rows);
		fmt_bytes(b, sizeof(b), m.bytes);
		fmt_bytes(bs, sizeof(bs),
			  m.elapsed_ms ? m.bytes * 1000 / m.elapsed_ms : 0);
		printf("; %s rows, %s streamed", r, b);
		if (m.elapsed_ms)
			printf(", %s/s", bs);
	}
	if (m.queued)
		printf("; %u more queued", m.queued);
	printf("\n\n");
}

/* The moves as a JSON member: "moves":{...}, before the tables. */
static void moves_json(void)
{
	struct emb_cluster_moves m;

	if (!moves_get(&m))
		return;
	printf("\"moves\":{\"kind\":\"%s\",\"rank\":", move_kinds[m.kind]);
	if (m.kind == EMB_MOVE_NONE)
		printf("null");
	else
		printf("%u", m.rank);
	printf(",\"phase\":\"%s\",\"first\":%u,\"slots\":%u,\"moved\":%u,"
	       "\"left\":%u,\"queued\":%u,\"rows\":%llu,\"bytes\":%llu,"
	       "\"elapsed_s\":%.3f,\"eta_s\":",
	       move_phases[m.phase], m.first, m.n, m.moved, m.left, m.queued,
	       (unsigned long long)m.rows, (unsigned long long)m.bytes,
	       (double)m.elapsed_ms / 1e3);
	if (m.eta_ms >= 0)
		printf("%.3f},", (double)m.eta_ms / 1e3);
	else
		printf("null},");
}

/* The map is shown only where it says more than the server list. */
static bool map_shown(struct emb_client *c)
{
	struct emb_client_map m = EMB_SIZED(struct emb_client_map);

	emb_client_map(c, &m);
	if (m.replicas > 1)
		return true;
	for (uint32_t s = 0; s < m.nservers; s++)
		if (emb_client_server_removed(c, s))
			return true;
	return false;
}

enum role { PRIMARY, BACKUP, FILLING };

/*
 * Server s's state: removed by the map, live, or "down": the map still
 * names it but it did not answer this sample (a server dead with slots
 * that lost every copy stays in the scheduler's map).
 */
static const char *state(struct emb_client *c, uint32_t s,
			 const struct sample *b)
{
	if (emb_client_server_removed(c, s))
		return "removed";
	return b->err[s] ? "down" : "live";
}

/*
 * The slots server s holds as primary, as a backup, or is being filled
 * with, as compact ranges "0-1364,2731-4095" ("-" for none) in buf, and
 * how many.
 */
static uint32_t slot_ranges(struct emb_client *c, uint32_t s, enum role role,
			    char *buf, size_t cap)
{
	uint32_t n = 0, start = 0, at = 0;
	bool in = false;

	buf[0] = '\0';
	for (uint32_t sl = 0; sl <= EMB_NSLOTS; sl++) {
		uint32_t h[HOLDERS_MAX];
		bool hit = false;

		if (sl < EMB_NSLOTS && role == FILLING) {
			hit = emb_client_slot_filling(c, sl) == (int)s;
		} else if (sl < EMB_NSLOTS) {
			int k = emb_client_slot_holders(c, sl, h,
							HOLDERS_MAX);

			for (int i = 0; i < k && i < (int)HOLDERS_MAX; i++)
				hit |= h[i] == s && (i > 0) == (role == BACKUP);
		}
		n += hit;
		if (hit && !in)
			start = sl;
		if (!hit && in && at + 1 < cap) {
			int w = sl - 1 == start
				    ? snprintf(buf + at, cap - at, "%s%u",
					       at ? "," : "", start)
				    : snprintf(buf + at, cap - at, "%s%u-%u",
					       at ? "," : "", start, sl - 1);

			at = w < 0 || (size_t)w >= cap - at ? (uint32_t)cap - 1
							    : at + (uint32_t)w;
		}
		in = hit;
	}
	if (!n)
		snprintf(buf, cap, "-");
	return n;
}

/* Slots whose every holder is removed or down in sample b: lost in all
 * but the map's name (the scheduler keeps the last map it could serve). */
static uint32_t unanswered_slots(struct emb_client *c, const struct sample *b)
{
	uint32_t n = 0;

	if (!b->nerr)
		return 0;
	for (uint32_t sl = 0; sl < EMB_NSLOTS; sl++) {
		uint32_t h[HOLDERS_MAX];
		int k = emb_client_slot_holders(c, sl, h, HOLDERS_MAX);
		bool any = false;

		for (int i = 0; i < k && i < (int)HOLDERS_MAX; i++)
			any |= !emb_client_server_removed(c, h[i]) &&
			       h[i] < MAX_SERVERS && !b->err[h[i]];
		n += k > 0 && !any;
	}
	return n;
}

/* The map as JSON members: "map":{...}, before the tables. */
static void map_json(struct emb_client *c, char *const *names, uint32_t nsrv,
		     const struct sample *b)
{
	static char pr[4096], bk[4096], fl[4096];
	struct emb_client_map m = EMB_SIZED(struct emb_client_map);

	emb_client_map(c, &m);
	printf("\"map\":{\"epoch\":%llu,\"replicas\":%u,\"lost_slots\":%u,"
	       "\"unanswered_slots\":%u,\"servers\":[",
	       (unsigned long long)m.epoch, m.replicas, m.lost_slots,
	       unanswered_slots(c, b));
	for (uint32_t s = 0; s < nsrv; s++) {
		uint32_t np = slot_ranges(c, s, PRIMARY, pr, sizeof(pr));
		uint32_t nb = slot_ranges(c, s, BACKUP, bk, sizeof(bk));
		uint32_t nf = slot_ranges(c, s, FILLING, fl, sizeof(fl));

		printf("%s{\"server\":", s ? "," : "");
		json_str(names[s]);
		printf(",\"state\":\"%s\",\"primary_slots\":%u,"
		       "\"backup_slots\":%u,\"primary\":",
		       state(c, s, b), np, nb);
		json_str(np ? pr : "");
		printf(",\"backup\":");
		json_str(nb ? bk : "");
		printf(",\"filling_slots\":%u,\"filling\":", nf);
		json_str(nf ? fl : "");
		putchar('}');
	}
	printf("]},");
}

/* The map as text: epoch, replicas, and each server's state and slots. */
static void map_text(struct emb_client *c, char *const *names, uint32_t nsrv,
		     const struct sample *b)
{
	static char pr[4096], bk[4096], fl[4096];
	struct emb_client_map m = EMB_SIZED(struct emb_client_map);
	uint32_t unanswered = unanswered_slots(c, b);
	bool filling = false;

	emb_client_map(c, &m);
	for (uint32_t sl = 0; sl < EMB_NSLOTS && !filling; sl++)
		filling = emb_client_slot_filling(c, sl) >= 0;
	printf("map epoch %llu, %u replica%s, %u lost slot%s\n",
	       (unsigned long long)m.epoch, m.replicas,
	       m.replicas == 1 ? "" : "s", m.lost_slots,
	       m.lost_slots == 1 ? "" : "s");
	if (unanswered)
		printf("%u slots have no holder answering: their rows cannot "
		       "be read or written\n",
		       unanswered);
	/* A recovery under way adds the slots each server is filled with. */
	if (filling)
		printf("%-21s %-8s %-24s %-24s %s\n", "SERVER", "STATE",
		       "PRIMARY SLOTS", "BACKUP SLOTS", "FILLING SLOTS");
	else
		printf("%-21s %-8s %-24s %s\n", "SERVER", "STATE",
		       "PRIMARY SLOTS", "BACKUP SLOTS");
	for (uint32_t s = 0; s < nsrv; s++) {
		slot_ranges(c, s, PRIMARY, pr, sizeof(pr));
		slot_ranges(c, s, BACKUP, bk, sizeof(bk));
		slot_ranges(c, s, FILLING, fl, sizeof(fl));
		if (filling)
			printf("%-21s %-8s %-24s %-24s %s\n", names[s],
			       state(c, s, b), pr, bk, fl);
		else
			printf("%-21s %-8s %-24s %s\n", names[s],
			       state(c, s, b), pr, bk);
	}
	putchar('\n');
}

/*
 * b with rates against a as one JSON object on one line: the time, the
 * interval, and one object per server and table with the columns of the
 * table (rates per second, memory in bytes).
 */
static void show_json(struct emb_client *c, char *const *names, uint32_t nsrv,
		      const struct sample *a, const struct sample *b)
{
	double dt = b->at_s - a->at_s;
	bool first = true;

	printf("{\"time\":%lld,\"interval_s\":%.3f,\"servers\":%u,",
	       (long long)time(NULL), dt, nsrv);
	if (map_shown(c))
		map_json(c, names, nsrv, b);
	moves_json();
	/* Servers that could not be read: their tables are missing below. */
	if (b->nerr) {
		bool any = false;

		printf("\"not_read\":[");
		for (uint32_t s = 0; s < nsrv; s++) {
			if (!b->err[s])
				continue;
			printf("%s{\"server\":", any ? "," : "");
			json_str(names[s]);
			printf(",\"error\":");
			json_str(emb_strerror(b->err[s]));
			putchar('}');
			any = true;
		}
		printf("],");
	}
	printf("\"tables\":[");
	for (uint32_t i = 0; i < b->n; i++) {
		const struct emb_client_server_table *e = &b->t[i];
		const struct emb_client_server_table *o =
		    find(a, e->server, e->name);

		if (e->server >= nsrv)
			continue;
		printf("%s{\"server\":", first ? "" : ",");
		json_str(names[e->server]);
		printf(",\"table\":");
		json_str(e->name);
		printf(",\"row_format\":\"%s\"", emb_rowfmt_name(e->row_format));
		printf(",\"dim\":%u,\"rows\":%llu,\"memory_bytes\":%llu,"
		       "\"pulls_per_s\":%.1f,\"pushes_per_s\":%.1f,"
		       "\"rows_pulled_per_s\":%.1f,\"rows_pushed_per_s\":%.1f",
		       e->dim, (unsigned long long)e->rows,
		       (unsigned long long)e->bytes,
		       o ? rate(o->pulls, e->pulls, dt) : 0.0,
		       o ? rate(o->pushes, e->pushes, dt) : 0.0,
		       o ? rate(o->rows_pulled, e->rows_pulled, dt) : 0.0,
		       o ? rate(o->rows_pushed, e->rows_pushed, dt) : 0.0);
		/* Every counter of the table, as totals (common/tabledef.h). */
#define EMB__STAT_JSON(name, what)                                             \
	printf("%s\"" #name "\":%llu", k++ ? "," : "",                          \
	       (unsigned long long)e->name);
		{
			unsigned k = 0;

			printf(",\"totals\":{");
			EMB_TABLE_STATS(EMB__STAT_JSON)
			printf("}}");
		}
#undef EMB__STAT_JSON
		first = false;
	}
	printf("]}\n");
	fflush(stdout);
}

/*
 * Under a table's row: what admission and eviction did (totals since the
 * server started), only for a table that has a policy at work.
 */
static void print_lifecycle(const struct emb_client_server_table *e)
{
	if (!e->admit_filter_bytes && !e->pulls_unadmitted &&
	    !e->pushes_unadmitted && !e->rows_evicted)
		return;
	printf("%-21s   admission: %llu pulls and %llu pushes of ids not "
	       "admitted, filter %llu B; evicted: %llu (ttl %llu, l2 %llu, "
	       "max_rows %llu)\n",
	       "", (unsigned long long)e->pulls_unadmitted,
	       (unsigned long long)e->pushes_unadmitted,
	       (unsigned long long)e->admit_filter_bytes,
	       (unsigned long long)e->rows_evicted,
	       (unsigned long long)e->rows_evicted_ttl,
	       (unsigned long long)e->rows_evicted_l2,
	       (unsigned long long)e->rows_evicted_cap);
}

/*
 * Under a tiered table's row: its rows on the device, the tier file, and
 * the device's reads and writes per second with the mean wait of a read
 * over the two samples (docs/store.md, "The device tier").
 */
static void print_tier(const struct emb_client_server_table *e,
		       const struct emb_client_server_table *o, double dt)
{
	char fb[16], rr[16], wr[16];
	uint64_t reads = o && e->tier_reads >= o->tier_reads
			     ? e->tier_reads - o->tier_reads
			     : 0;
	uint64_t us = o && e->tier_read_us >= o->tier_read_us
			  ? e->tier_read_us - o->tier_read_us
			  : 0;

	if (!e->tier_bytes && !e->rows_cold)
		return;
	fmt_bytes(fb, sizeof(fb), e->tier_bytes);
	fmt_count(rr, sizeof(rr), o ? rate(o->tier_reads, e->tier_reads, dt) : 0);
	fmt_count(wr, sizeof(wr),
		  o ? rate(o->tier_writes, e->tier_writes, dt) : 0);
	printf("%-21s   tier: %llu rows on the device (%.0f %%), file %s; "
	       "%s reads/s, %s writes/s",
	       "", (unsigned long long)e->rows_cold,
	       e->rows ? 100.0 * (double)e->rows_cold / (double)e->rows : 0.0,
	       fb, rr, wr);
	if (reads)
		printf(", %.0f us waiting per block read",
		       (double)us / (double)reads);
	printf("\n");
}

/* Prints b with rates against a (NULL: none yet). */
static void show(struct emb_client *c, char *const *names, uint32_t nsrv,
		 const struct sample *a, const struct sample *b, bool tty)
{
	double dt = a ? b->at_s - a->at_s : 0;
	char when[32];
	time_t now = time(NULL);
	struct tm tm;

	localtime_r(&now, &tm);
	strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
	if (tty)
		fputs("\033[H\033[2J", stdout);
	printf(
	    "embstore stat  %s  %u server%s, %u table%s  rates over %.1f s\n",
	    when, nsrv, nsrv == 1 ? "" : "s", b->n, b->n == 1 ? "" : "s", dt);
	if (map_shown(c))
		map_text(c, names, nsrv, b);
	moves_text();
	printf("%-21s %-16s %5s %-4s %9s %10s %9s %9s %11s %11s\n", "SERVER",
	       "TABLE", "DIM", "FMT", "ROWS", "MEMORY", "PULLS/S", "PUSHES/S",
	       "ROWS-PULL/S", "ROWS-PUSH/S");
	for (uint32_t s = 0; s < nsrv; s++) {
		uint64_t rows = 0, bytes = 0;
		double sum[4] = {0};
		uint32_t ntab = 0;

		for (uint32_t i = 0; i < b->n; i++) {
			const struct emb_client_server_table *e = &b->t[i];
			const struct emb_client_server_table *o =
			    a ? find(a, s, e->name) : NULL;
			double r[4] = {0};

			if (e->server != s)
				continue;
			if (o) {
				r[0] = rate(o->pulls, e->pulls, dt);
				r[1] = rate(o->pushes, e->pushes, dt);
				r[2] = rate(o->rows_pulled, e->rows_pulled, dt);
				r[3] = rate(o->rows_pushed, e->rows_pushed, dt);
			}
			print_row(names[s], e->name, e->dim,
				  emb_rowfmt_name(e->row_format), e->rows, e->bytes,
				  r);
			print_lifecycle(e);
			print_tier(e, o, dt);
			rows += e->rows;
			bytes += e->bytes;
			for (int k = 0; k < 4; k++)
				sum[k] += r[k];
			ntab++;
		}
		if (emb_client_server_removed(c, s))
			printf("%-21s %-16s\n", names[s], "(removed)");
		else if (b->err[s])
			printf("%-21s (not read: %s)\n", names[s],
			       emb_strerror(b->err[s]));
		else if (ntab == 0)
			printf("%-21s %-16s\n", names[s], "(no tables)");
		else if (ntab > 1)
			print_row(names[s], "(all)", 0, "", rows, bytes, sum);
	}
	fflush(stdout);
}

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: embstore stat --servers LIST [options]\n"
	    "Rows, memory and op rates per server and table, from two "
	    "samples.\n"
	    "  --servers LIST        host:port[,host:port...] (EMB_SERVERS)\n"
	    "  --sched HOST:PORT     find the servers and the map "
	    "(replicas, failovers)\n"
	    "                        through the scheduler\n"
	    "  --coordinator etcd://HOST:PORT[,...]  the same for a job "
	    "kept in etcd\n"
	    "                        (EMB_COORDINATOR)\n"
	    "  --job NAME            its job (EMB_JOB; default "
	    "embstore)\n"
	    "  --interval S          seconds between the two samples of "
	    "a rate (default 1)\n"
	    "  --watch N             redraw every N seconds until Ctrl-C\n"
	    "  --json                one JSON object per sample, one a "
	    "line\n"
	    "  --transport tcp|rdma  (EMB_TRANSPORT; default tcp)\n"
	    "  --auth-token-file F   (EMB_AUTH_TOKEN_FILE)\n"
	    "  --log-level L         error|warn|info|debug (default "
	    "error)\n"
	    "  --help, --version\n");
}

/* Splits LIST at commas into names[] (malloc'd copies), as the client
 * numbers its servers. Returns how many, or 0 if malformed. */
static uint32_t split_servers(const char *list, char **names, uint32_t max)
{
	uint32_t n = 0;
	const char *p = list;

	while (*p && n < max) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);

		names[n] = strndup(p, len);
		if (!names[n] || !len)
			break;
		n++;
		if (!end)
			return n;
		p = end + 1;
	}
	for (uint32_t i = 0; i <= n && i < max; i++) {
		free(names[i]);
		names[i] = NULL;
	}
	return 0;
}

static bool parse_seconds(const char *s, double lo, double *out)
{
	uint64_t ms;

	if (emb_seconds_parse(s, (uint64_t)(lo * 1000), 86400000, &ms))
		return false;
	*out = ms / 1000.0;
	return true;
}

int emb_cmd_stat(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"servers", required_argument, NULL, 's'},
	    {"sched", required_argument, NULL, 'S'},
	    {"coordinator", required_argument, NULL, 'C'},
	    {"job", required_argument, NULL, 'J'},
	    {"interval", required_argument, NULL, 'i'},
	    {"watch", required_argument, NULL, 'w'},
	    {"transport", required_argument, NULL, 'T'},
	    {"auth-token-file", required_argument, NULL, 'a'},
	    {"log-level", required_argument, NULL, 'L'},
	    {"json", no_argument, NULL, 'j'},
	    {"help", no_argument, NULL, 'h'},
	    {"version", no_argument, NULL, 'V'},
	    {NULL, 0, NULL, 0},
	};
	struct emb_client_opts co = EMB_CLIENT_OPTS_DEFAULT;
	const char *servers = getenv("EMB_SERVERS");
	const char *token_file = getenv("EMB_AUTH_TOKEN_FILE");
	const char *sched = NULL, *level = "error";
	const char *coord = getenv("EMB_COORDINATOR"), *job = getenv("EMB_JOB");
	bool coord_flag = false;
	static char sched_servers[65536];
	char *names[MAX_SERVERS] = {0};
	uint8_t token[EMB_WIRE_TOKEN_MAX + 1];
	struct sample a = {0}, b = {0};
	struct emb_client *c = NULL;
	double interval = 1, watch = 0;
	enum emb_log_level lvl;
	struct sigaction sa;
	uint32_t nsrv;
	bool tty, json = false;
	int opt, rc, status = 1;

	co.transport =
	    getenv("EMB_TRANSPORT") ? getenv("EMB_TRANSPORT") : "tcp";
	co.timeout_ms = 5000;
	co.name = "embstore-stat";
	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (opt) {
		case 's':
			servers = optarg;
			break;
		case 'S':
			sched = optarg;
			break;
		case 'C':
			coord = optarg;
			coord_flag = true;
			break;
		case 'J':
			job = optarg;
			break;
		case 'i':
			if (!parse_seconds(optarg, 0.1, &interval)) {
				fprintf(stderr,
					"embstore stat: bad --interval "
					"'%s'\n",
					optarg);
				return 2;
			}
			break;
		case 'w':
			if (!parse_seconds(optarg, 0.1, &watch)) {
				fprintf(stderr,
					"embstore stat: bad --watch "
					"'%s'\n",
					optarg);
				return 2;
			}
			break;
		case 'T':
			co.transport = optarg;
			break;
		case 'a':
			token_file = optarg;
			break;
		case 'L':
			level = optarg;
			break;
		case 'j':
			json = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("embstore %s\n", EMB_VERSION);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "embstore stat: unexpected argument '%s'\n",
			argv[optind]);
		return 2;
	}
	if (emb_log_parse_level(level, &lvl)) {
		fprintf(stderr, "embstore stat: bad --log-level '%s'\n", level);
		return 2;
	}
	emb_log_set_level(lvl);
	if (token_file && *token_file) {
		if (emb_token_read_file(token_file, token,
					&co.auth_token_len)) {
			fprintf(stderr,
				"embstore stat: cannot use token file "
				"%s\n",
				token_file);
			status = 2;
			goto out;
		}
		co.auth_token = token;
	}
	/* EMB_COORDINATOR alone names the job only when nothing else names
	 * the servers. */
	if (!coord_flag && (sched || (servers && *servers)))
		coord = NULL;
	if (coord && *coord && sched) {
		fprintf(stderr, "embstore stat: give --sched or --coordinator, "
				"not both\n");
		return 2;
	}
	if (coord && *coord) {
		if (!emb_coord_is_etcd(coord)) {
			fprintf(stderr,
				"embstore stat: bad --coordinator '%s' (want "
				"etcd://HOST:PORT[,HOST:PORT...])\n",
				coord);
			return 2;
		}
		g_coord = coord;
		g_job = job && *job ? job : NULL;
		rc = emb_client_from_coordinator(&co, coord, g_job, &c);
		if (!rc)
			rc = emb_client_servers(c, sched_servers,
						sizeof(sched_servers));
		if (rc) {
			fprintf(stderr, "embstore stat: job %s in %s: %s\n",
				g_job ? g_job : "embstore", coord,
				rc == EMB_ECLUSTER ? "no such job running"
						   : emb_strerror(rc));
			goto out;
		}
		servers = sched_servers;
	} else if (sched) {
		g_sched = sched;
		g_token = co.auth_token;
		g_token_len = co.auth_token_len;
		/* The scheduler's map: replicas, and no connection to the
		 * servers a failover removed. */
		rc = emb_client_from_sched(&co, sched, &c);
		if (!rc)
			rc = emb_client_servers(c, sched_servers,
						sizeof(sched_servers));
		if (rc) {
			fprintf(stderr, "embstore stat: scheduler %s: %s\n",
				sched, emb_strerror(rc));
			goto out;
		}
		servers = sched_servers;
	}
	if (!servers || !*servers) {
		fprintf(stderr, "embstore stat: give --servers (or "
				"EMB_SERVERS)\n");
		usage(stderr);
		return 2;
	}
	nsrv = split_servers(servers, names, MAX_SERVERS);
	if (!nsrv) {
		fprintf(stderr, "embstore stat: bad server list '%s'\n",
			servers);
		return 2;
	}
	co.servers = servers;
	rc = c ? 0 : emb_client_create(&co, &c);
	if (rc) {
		fprintf(stderr, "embstore stat: cannot connect to %s: %s\n",
			servers, emb_strerror(rc));
		goto out;
	}

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_sigint;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	tty = isatty(STDOUT_FILENO);

	rc = take(c, &a);
	while (!rc && !stop_flag) {
		nap(watch > 0 ? watch : interval);
		if (stop_flag)
			break;
		rc = take(c, &b);
		/* Watching goes on through a server's restart: the client
		 * reconnects, and a sample that failed is skipped. */
		if (rc && watch > 0) {
			fprintf(stderr,
				"embstore stat: cannot read stats: %s; "
				"trying again\n",
				emb_strerror(rc));
			rc = 0;
			continue;
		}
		if (rc)
			break;
		if (json)
			show_json(c, names, nsrv, &a, &b);
		else
			show(c, names, nsrv, &a, &b, tty && watch > 0);
		if (watch <= 0)
			break;
		/* b becomes the older sample; a's buffer is reused. */
		{
			struct sample t = a;

			a = b;
			b = t;
		}
	}
	if (rc) {
		fprintf(stderr, "embstore stat: cannot read stats: %s\n",
			emb_strerror(rc));
		goto out;
	}
	/* One sample shown with servers missing: said, and exit 1, so a
	 * script sees the job is not whole. (After Ctrl-C, 0 as ever.) */
	status = 0;
	if (watch <= 0 && b.nerr) {
		for (uint32_t s = 0; s < nsrv; s++)
			if (b.err[s])
				fprintf(stderr,
					"embstore stat: server %s: cannot read "
					"stats: %s\n",
					names[s], emb_strerror(b.err[s]));
		status = 1;
	}
out:
	free(a.t);
	free(b.t);
	emb_client_destroy(c);
	for (uint32_t i = 0; i < MAX_SERVERS; i++)
		free(names[i]);
	return status;
}
