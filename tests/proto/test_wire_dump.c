/*
 * tests/proto/test_wire_dump.c - DUMP_BEGIN's info carries the table's row
 * format and rounding: every format round-trips, an fp32 table's info is
 * what earlier servers sent (the flags' format bits 0), row words follow
 * the format, and an unknown format word or a size that disagrees with
 * the format is refused. Single-threaded.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "common/optim.h"
#include "common/rowfmt.h"
#include "proto/wire.h"
#include "proto/wire_dump.h"
#include "harness.h"

static _Alignas(8) uint8_t buf[4096];

static struct emb_wire_dump_info info_make(uint32_t fmt, uint32_t rounding)
{
	struct emb_wire_dump_info info = {0};

	snprintf(info.spec.name, sizeof(info.spec.name), "%s", "emb");
	info.spec.dim = 10;
	info.spec.optim = EMB_OPTIM_CFG_DEFAULT;
	info.spec.optim.kind = EMB_OPTIM_ADAGRAD;
	info.spec.init = EMB_INIT_CFG_DEFAULT;
	info.spec.row_format = fmt;
	info.spec.rounding = rounding;
	info.state_floats = 10;
	info.row_floats = emb_rowfmt_words(fmt, 10) + 10;
	info.rows = 5;
	info.step = 9;
	info.flags = EMB_WIRE_DUMP_CONSISTENT;
	return info;
}

static int round_trip(const struct emb_wire_dump_info *in,
		      struct emb_wire_dump_info *out)
{
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_frame f;
	int len = emb_wire_dump_info_encode(buf, sizeof(buf), 3, 1, in);

	if (len < 0)
		return len;
	CU_ASSERT_EQUAL_FATAL(emb_wire_frame_decode(buf, (size_t)len, &lim, &f),
			      0);
	return emb_wire_dump_info_decode(&f, out);
}

static void test_every_format_round_trips(void)
{
	for (uint32_t fmt = 0; fmt < EMB_ROWFMT_COUNT; fmt++) {
		for (uint32_t r = 0; r < 2; r++) {
			struct emb_wire_dump_info in = info_make(fmt, r), out;
			uint32_t flags;

			CU_ASSERT_EQUAL_FATAL(round_trip(&in, &out), 0);
			CU_ASSERT_EQUAL(out.spec.row_format, fmt);
			/* fp32 never rounds: it reads as the default. */
			CU_ASSERT_EQUAL(out.spec.rounding,
					fmt == EMB_ROWFMT_FP32
					    ? (uint32_t)EMB_ROUND_STOCHASTIC
					    : r);
			CU_ASSERT_EQUAL(out.row_floats, in.row_floats);
			CU_ASSERT_EQUAL(out.flags, EMB_WIRE_DUMP_CONSISTENT);
			flags = emb_le32_load(buf + EMB_WIRE_HDR_SIZE + 152);
			if (fmt == EMB_ROWFMT_FP32)
				CU_ASSERT_EQUAL(flags,
						EMB_WIRE_DUMP_CONSISTENT);
		}
	}
	/* int8 of dim 10: 18 bytes, 5 words. */
	CU_ASSERT_EQUAL(info_make(EMB_ROWFMT_INT8, 0).row_floats, 15);
}

static void test_bad_format_refused(void)
{
	struct emb_wire_dump_info in = info_make(EMB_ROWFMT_FP16, 0), out;
	struct emb_wire_limits lim = EMB_WIRE_LIMITS_DEFAULT;
	struct emb_wire_frame f;
	int len;

	/* Rows sized for fp32 under an fp16 format. */
	in.row_floats = 20;
	CU_ASSERT_EQUAL(round_trip(&in, &out), EMB_EBADFRAME);
	/* Unknown format or rounding: not encoded. */
	in = info_make(4, 0);
	CU_ASSERT_EQUAL(round_trip(&in, &out), EMB_EBADFORMAT);
	in = info_make(EMB_ROWFMT_BF16, 7);
	CU_ASSERT_EQUAL(round_trip(&in, &out), EMB_EBADFORMAT);
	/* Words a server could send wrongly. */
	in = info_make(EMB_ROWFMT_FP16, 0);
	len = emb_wire_dump_info_encode(buf, sizeof(buf), 3, 1, &in);
	CU_ASSERT_FATAL(len > 0);
	{
		static const uint32_t bad[] = {
		    4u << EMB_WIRE_DUMP_FMT_SHIFT,	 /* format 4 */
		    0x100u << EMB_WIRE_DUMP_FMT_SHIFT, /* fp32 nearest */
		    1u << 20,			 /* beyond the word */
		    0x2u,				 /* unknown flag */
		};

		for (int i = 0; i < 4; i++) {
			emb_le32_store(buf + EMB_WIRE_HDR_SIZE + 152, bad[i]);
			CU_ASSERT_EQUAL_FATAL(
			    emb_wire_frame_decode(buf, (size_t)len, &lim, &f),
			    0);
			CU_ASSERT_EQUAL(emb_wire_dump_info_decode(&f, &out),
					EMB_EBADFRAME);
		}
	}
}

int main(int argc, char **argv)
{
	static const struct emb_test_case cases[] = {
	    {"every row format and rounding round-trips; fp32 as before",
	     test_every_format_round_trips},
	    {"a bad format word or row size is refused",
	     test_bad_format_refused},
	    {NULL, NULL},
	};

	return emb_test_main(argc, argv, "proto/wire_dump", cases);
}
