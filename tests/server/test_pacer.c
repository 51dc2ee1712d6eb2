/*
 * tests/server/test_pacer.c - the pace of a move's copy ahead under
 * --move-bound (src/server/pacer.h): more than a tenth of the reports
 * over the bound halve the rate, reports otherwise grow it up to the
 * cap, a tick between reports holds it and a long silence grows it,
 * never below the floor; one slow worker of two cuts, one of twenty does
 * not; an idle pacer starts over. Then PACE on the wire: a server takes
 * a worker's report and counts it, refuses a malformed one with a clear
 * error, and keeps serving the connection.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "netutil.h"

#include "common/err.h"
#include "proto/wire_msg.h"
#include "server/pacer.h"

#define MB (1024.0 * 1024.0)

/* The rule itself: halve when over a tenth of the reports are over the
 * bound, grow a quarter on reports otherwise. */
static void test_next(void)
{
	/* One report of one, over: halve. */
	CU_ASSERT_DOUBLE_EQUAL(emb__pacer_next(100 * MB, 1, 1, false, 0),
			       50 * MB, 1);
	/* Reports all within: grow. */
	CU_ASSERT_DOUBLE_EQUAL(emb__pacer_next(100 * MB, 3, 0, false, 0),
			       125 * MB, 1);
	/* One over of ten is a tenth, not more: grow; two of ten: halve. */
	CU_ASSERT_DOUBLE_EQUAL(emb__pacer_next(100 * MB, 10, 1, false, 0),
			       125 * MB, 1);
	CU_ASSERT_DOUBLE_EQUAL(emb__pacer_next(100 * MB, 10, 2, false, 0),
			       50 * MB, 1);
	/* No report while workers report (a tick between two windows):
	 * hold; none for a while (no one trains): grow. */
	CU_ASSERT_DOUBLE_EQUAL(emb__pacer_next(100 * MB, 0, 0, false, 0),
			       100 * MB, 1);
	CU_ASSERT_DOUBLE_EQUAL(emb__pacer_next(100 * MB, 0, 0, true, 0),
			       125 * MB, 1);
	/* Never over the cap, never under the floor. */
	CU_ASSERT_DOUBLE_EQUAL(emb__pacer_next(100 * MB, 0, 0, true, 110 * MB),
			       110 * MB, 1);
	CU_ASSERT_DOUBLE_EQUAL(emb__pacer_next(EMB_PACER_FLOOR, 1, 1, false, 0),
			       EMB_PACER_FLOOR, 1);
	/* A cap under the floor: a cut still slows, to a quarter of it. */
	CU_ASSERT_DOUBLE_EQUAL(emb__pacer_next(200000, 1, 1, false, 200000),
			       100000, 1);
	CU_ASSERT_DOUBLE_EQUAL(emb__pacer_next(60000, 1, 1, false, 200000),
			       50000, 1);
	/* No cap: "unpaced" at most. */
	CU_ASSERT_DOUBLE_EQUAL(emb__pacer_next(EMB_PACER_MAX, 0, 0, true, 0),
			       EMB_PACER_MAX, 1);
}

/* The fill thread's view: start, the reports' count, ticks. */
static void test_tick(void)
{
	struct emb__pacer p = {.bound_milli = 2000};
	uint64_t t = 1000000;
	double r;

	r = emb__pacer_tick(&p, t);
	CU_ASSERT_DOUBLE_EQUAL(r, EMB_PACER_START, 1);
	/* Within a tick nothing changes, whatever was reported. */
	emb__pacer_report(&p, 9000, 1000, t + 10);
	CU_ASSERT_DOUBLE_EQUAL(emb__pacer_tick(&p, t + 50), r, 1);
	/* One of three reports over the bound (the first, 9x): a cut. */
	emb__pacer_report(&p, 1500, 1000, t + 60);
	emb__pacer_report(&p, 1000, 1000, t + 70);
	t += EMB_PACER_TICK_MS;
	r = emb__pacer_tick(&p, t);
	CU_ASSERT_DOUBLE_EQUAL(r, EMB_PACER_START / 2, 1);
	CU_ASSERT_EQUAL(p.cuts, 1);
	CU_ASSERT_EQUAL(p.reports, 3);
	CU_ASSERT_EQUAL(p.rate_now, (uint64_t)r);
	/* A tick with no report while workers report: the rate holds. */
	t += EMB_PACER_TICK_MS;
	CU_ASSERT_DOUBLE_EQUAL(emb__pacer_tick(&p, t), r, 1);
	/* The next tick saw reports within the bound only, at it
	 * included: it grows. */
	emb__pacer_report(&p, 1900, 1000, t + 5);
	emb__pacer_report(&p, 2000, 1000, t + 6);
	t += EMB_PACER_TICK_MS;
	r = emb__pacer_tick(&p, t);
	CU_ASSERT_DOUBLE_EQUAL(r, EMB_PACER_START / 2 * 1.25, 1);
	/* Many workers, one of them slow (1 of 20 over): it grows still. */
	for (int i = 0; i < 20; i++)
		emb__pacer_report(&p, i ? 1000 : 9000, 1000, t + 5);
	t += EMB_PACER_TICK_MS;
	r = emb__pacer_tick(&p, t);
	CU_ASSERT_DOUBLE_EQUAL(r, EMB_PACER_START / 2 * 1.25 * 1.25, 1);
	CU_ASSERT_EQUAL(p.cuts, 1);
	/* A thread starved for many ticks looks once: one report, one
	 * cut. */
	emb__pacer_report(&p, 5000, 1000, t + 5);
	t += 1000;
	r = emb__pacer_tick(&p, t);
	CU_ASSERT_DOUBLE_EQUAL(r, EMB_PACER_START / 2 * 1.25 * 1.25 / 2, 1);
	CU_ASSERT_EQUAL(p.cuts, 2);
	/* No one has reported for EMB_PACER_QUIET_MS: each tick grows. */
	t += EMB_PACER_QUIET_MS;
	r = emb__pacer_tick(&p, t);
	t += EMB_PACER_TICK_MS;
	CU_ASSERT_DOUBLE_EQUAL(emb__pacer_tick(&p, t), r * 1.25, 1);
	/* A report stamped after the tick read the clock is not quiet. */
	emb__pacer_report(&p, 1000, 1000, t + 500);
	r = emb__pacer_tick(&p, t + EMB_PACER_TICK_MS);
	CU_ASSERT_DOUBLE_EQUAL(emb__pacer_tick(&p, t + 2 * EMB_PACER_TICK_MS),
			       r, 1);
	/* Idle past EMB_PACER_IDLE_MS: a new move starts over. */
	emb__pacer_report(&p, 5000, 1000, t);
	t += EMB_PACER_IDLE_MS + 1000;
	r = emb__pacer_tick(&p, t);
	CU_ASSERT_DOUBLE_EQUAL(r, EMB_PACER_START, 1);
	CU_ASSERT_EQUAL(p.tally, 0);
	/* A ratio past u32 (a baseline of 1 us) is over, not a wrap. */
	emb__pacer_report(&p, UINT32_MAX, 1, t);
	CU_ASSERT_EQUAL(p.tally, 1u + (UINT64_C(1) << 32));
}

/* The response to one frame sent on fd. */
static int call(int fd, const void *frame, size_t len, char *msg, size_t cap)
{
	struct emb_frame_hdr h;
	uint8_t payload[8 + EMB_WIRE_ERRMSG_MAX];
	int rc;

	msg[0] = '\0';
	rc = nt_raw_send(fd, frame, len);
	if (!rc)
		rc = nt_raw_recv(fd, &h, payload, sizeof(payload));
	if (rc)
		return rc;
	if (h.status < 0 && h.payload_len > 4)
		snprintf(msg, cap, "%.*s", (int)(h.payload_len - 4),
			 (const char *)payload + 4);
	return h.status;
}

static void test_wire(void)
{
	struct emb_server_opts so = nt_server_opts();
	struct emb_server *s;
	struct emb_server_stats st;
	struct emb_wire_pace_req r = {.p99_us = 9000, .base_us = 3000,
				      .calls = 40};
	_Alignas(8) uint8_t buf[64];
	char msg[EMB_WIRE_ERRMSG_MAX + 1];
	int fd, len;

	so.move_bound = 2;
	s = nt_server_start(&so);
	CU_ASSERT_FATAL(s != NULL);
	fd = nt_raw_connect(emb_server_port(s));
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL_FATAL(nt_raw_hello(fd, NULL, 0), 0);
	len = emb_wire_pace_req_encode(buf, sizeof(buf), 1, &r);
	CU_ASSERT_EQUAL_FATAL(len, 48);
	CU_ASSERT_EQUAL(call(fd, buf, (size_t)len, msg, sizeof(msg)), 0);
	emb_server_stats(s, &st);
	CU_ASSERT_EQUAL(st.pace_reports, 1);
	CU_ASSERT_EQUAL(st.pace_cuts, 0); /* no copy ahead ran */
	/* A report of 0 us: refused, said why, not counted. */
	emb_le32_store(buf + 32, 0);
	CU_ASSERT_EQUAL(call(fd, buf, (size_t)len, msg, sizeof(msg)),
			EMB_EBADFRAME);
	CU_ASSERT(msg[0] != '\0');
	emb_server_stats(s, &st);
	CU_ASSERT_EQUAL(st.pace_reports, 1);
	/* The connection still serves: a good report again. */
	len = emb_wire_pace_req_encode(buf, sizeof(buf), 2, &r);
	CU_ASSERT_EQUAL(call(fd, buf, (size_t)len, msg, sizeof(msg)), 0);
	emb_server_stats(s, &st);
	CU_ASSERT_EQUAL(st.pace_reports, 2);
	close(fd);
	/* Before HELLO, PACE is refused like any request but HELLO. */
	fd = nt_raw_connect(emb_server_port(s));
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_NOT_EQUAL(call(fd, buf, (size_t)len, msg, sizeof(msg)), 0);
	emb_server_stats(s, &st);
	CU_ASSERT_EQUAL(st.pace_reports, 2);
	close(fd);
	emb_server_destroy(s);
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"over a tenth of the reports over the bound halve the pace, "
	     "others grow it, silence holds it unless long, between floor "
	     "and cap",
	     test_next},
	    {"the fill's ticks: one slow worker of two cuts, one of twenty "
	     "does not, a starved thread looks once, quiet grows, an idle "
	     "pacer starts over",
	     test_tick},
	    {"PACE on the wire: counted, a malformed one refused with a "
	     "reason, none before HELLO",
	     test_wire},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "pacer", cases);
}
