#!/bin/sh
# tools/onesided-cpu-vm.sh - server CPU per million rows pulled, two-sided
# against one-sided (RDMA READ) pulls, and rows/s of both, from one
# --remote-read server in the Soft-RoCE VM, in alternating rounds of one VM
# run so the ratios come from the same run.
#
#   ../shared/rdma-vm/run -- tools/onesided-cpu-vm.sh [BUILD_DIR]
#
# Environment: ROWS (100000 rows of dim 64, SGD), DIST (uniform), ROUNDS
# (3), WARMUP (4 s), DURATION (8 s), BATCH (4096).
# The server runs on CPU 1 and embstore-bench on CPU 0 (taskset), so that
# the kernel work rxe does for the client (Soft-RoCE answers READs in a
# tasklet on the CPU that sent them) is not charged to the server. The
# server's CPU is utime + stime of /proc/PID/stat, all threads:
#   whole   around each embstore-bench process, first pulls included (a
#           one-sided client learns locations by pulling two-sided and
#           LOCATE); rows = the timed rows only, so this overstates both
#   steady  sampled from 2 s into the timed phase until 1 s before its end,
#           against rows/s x the sampled seconds
# Prints one line per run, then per mode medians and ranges.
B=${1:-build}
ROWS=${ROWS:-100000}
DIST=${DIST:-uniform}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-4}
DURATION=${DURATION:-8}
BATCH=${BATCH:-4096}
if [ -z "$RDMA_VM_IP" ]; then
	echo "onesided-cpu-vm: run inside ../shared/rdma-vm (RDMA_VM_IP unset)" >&2
	exit 2
fi
if [ "$DURATION" -lt 4 ]; then
	echo "onesided-cpu-vm: DURATION must be at least 4 s" >&2
	exit 2
fi
tick=$(getconf CLK_TCK)
dir=$(mktemp -d "${TMPDIR:-/tmp}/onesided-cpu.XXXXXX")
trap 'rm -rf "$dir"' EXIT

taskset -c 1 $B/tools/embstore-server --listen "$RDMA_VM_IP:7164" \
	--transport rdma --threads 1 --remote-read --log-level warn \
	2>"$dir/server.log" &
S=$!
# The first run creates the rows; it is not counted.
i=0
until taskset -c 0 $B/tools/embstore-bench --servers "$RDMA_VM_IP:7164" \
	--transport rdma --rows "$ROWS" --batch "$BATCH" --dim 64 \
	--op pull --batches 1 >/dev/null 2>&1; do
	i=$((i + 1))
	if [ $i -gt 30 ]; then
		echo "onesided-cpu-vm: server did not come up" >&2
		cat "$dir/server.log" >&2
		kill $S
		exit 1
	fi
	sleep 1
done

ticks() { awk '{ print $14 + $15 }' /proc/$S/stat; }
win=$((DURATION - 3))

r=1
while [ $r -le "$ROUNDS" ]; do
	for m in twosided onesided; do
		w0=$(ticks)
		taskset -c 0 $B/tools/embstore-bench --servers "$RDMA_VM_IP:7164" \
			--transport rdma --pull-mode $m --no-preload \
			--rows "$ROWS" --batch "$BATCH" --dim 64 --dist "$DIST" \
			--op pull --warmup "$WARMUP" --duration "$DURATION" \
			--json >"$dir/run.json" 2>"$dir/run.log" &
		P=$!
		# Timed phase: after the warm-up and about 1 s of connecting.
		sleep $((WARMUP + 3))
		s0=$(ticks)
		sleep $win
		s1=$(ticks)
		wait $P
		w1=$(ticks)
		sed -n 's/.*"elapsed_s":\([0-9.]*\).*"rows_per_s":\([0-9]*\).*"rows_read":\([0-9]*\),"rows_fallback":\([0-9]*\).*/\1 \2 \3 \4/p' "$dir/run.json" |
			awk -v m=$m -v r=$r -v dw=$((w1 - w0)) -v ds=$((s1 - s0)) \
				-v win=$win -v tick="$tick" '{
				rows = $1 * $2
				whole = dw / tick / (rows / 1e6)
				steady = ds / tick / ($2 * win / 1e6)
				printf "round %d %s: rows/s %d; server cpu whole run %.2f s = %.3f s per M rows; steady %.2f s in %d s = %.3f s per M rows; rows READ %d, two-sided %d\n",
					r, m, $2, dw / tick, whole, ds / tick, win, steady, $3, $4
				printf "%s %d %.4f %.4f\n", m, $2, whole, steady >> "'"$dir/runs"'"
			}'
	done
	r=$((r + 1))
done
kill $S
wait $S 2>/dev/null

# Medians and ranges per mode: rows/s, whole-run and steady s/M rows.
med() {
	sort -g | awk '{ v[NR] = $1 } END {
		m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
		printf "%s %s %s ", m, v[1], v[NR] }'
}
for m in twosided onesided; do
	for col in 2 3 4; do
		grep "^$m " "$dir/runs" | awk -v c=$col '{ print $c }' | med
	done | awk -v m=$m '{ printf "%s: rows/s median %d (%d..%d); server cpu per M rows, whole run median %.3f s (%.3f..%.3f), steady median %.3f s (%.3f..%.3f)\n", m, $1, $2, $3, $4, $5, $6, $7, $8, $9 }'
done
awk '
	$1 == "twosided" { t[++nt] = $4 }
	$1 == "onesided" { o[++no] = $4 }
	END {
		for (i = 1; i <= nt && i <= no; i++)
			if (t[i] > 0)
				printf "round %d steady one-sided/two-sided: %.3f\n", i, o[i] / t[i]
	}' "$dir/runs"
