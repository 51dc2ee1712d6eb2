#!/bin/bash
# tests/tools/docs_commands.sh SRC BUILD - the documentation's commands and
# scripts, run as written with the built programs. In docs/training.md,
# docs/deploy.md, docs/operations.md, docs/bench.md, docs/coordinator.md
# and docs/replication.md:
#   - a fenced block introduced by "`deploy/...`:" (or examples/, tests/)
#     must equal that file;
#   - every other sh block runs, in order, from a directory that looks like
#     a built checkout (build/, deploy/, examples/), with build/tools on
#     PATH, and must exit 0; fixed ports (6170, 6171, 7164, 7174, 8081,
#     9464, and etcd's 2379 and 2380) are swapped for free ones first;
#   - an sh block after "<!-- not run: WHY -->" is only parsed (bash -n).
# A missing --after-train command is reported as such. Then the scripts
# no block runs: deploy/slurm/embstore.sbatch with
# stand-ins for srun and scontrol that run every task here,
# deploy/kubernetes/embstore.yaml checked as Kubernetes objects (each
# container's options are ones its program takes), and the systemd unit
# verified and its server.env served. Needs python3 (else SKIP).
set -u
. "$(dirname "$0")/../lib.sh"
SRC=$(cd "${1:?usage: docs_commands.sh SRC BUILD}" && pwd)
BUILD=$(cd "${2:?}" && pwd)
command -v python3 >/dev/null 2>&1 || exit 77

work=$(mktemp -d "${TMPDIR:-/tmp}/emb-docs-XXXXXX") || exit 1
cleanup() {
	# Whatever a block left running (its own process group).
	for g in $groups; do
		kill -- -"$g" 2>/dev/null
	done
	rm -rf "$work"
}
groups=
trap cleanup EXIT
fail=0
ln -s "$BUILD" "$work/build"
ln -s "$SRC/deploy" "$work/deploy"
ln -s "$SRC/examples" "$work/examples"
export PATH="$BUILD/tools:$PATH"
unset EMB_ROLE EMB_SCHED_HOST EMB_SCHED_PORT EMB_SERVERS EMB_LISTEN MS_ROLE \
	MS_SCHED_HOST TRAINING_ROLE PADDLE_PSERVERS_IP_PORT_LIST

# Splits the docs into $work/blocks: NNN.run (to run), NNN.parse (bash -n
# only); file blocks are compared here. Prints problems, exits 1 on any.
python3 - "$SRC" "$work/blocks" docs/training.md docs/deploy.md \
	docs/operations.md docs/bench.md docs/coordinator.md \
	docs/replication.md <<'EOF' ||
import os, re, sys
src, out = sys.argv[1], sys.argv[2]
os.makedirs(out)
n, bad = 0, 0
for doc in sys.argv[3:]:
    lines = open(os.path.join(src, doc)).read().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)$", lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i
        j = i + 1
        while lines[j] != "```":
            j += 1
        body = "\n".join(lines[i + 1:j]) + "\n"
        before = [l for l in lines[max(0, start - 3):start] if l.strip()]
        prev = before[-1] if before else ""
        f = re.match(r"^`((?:deploy|examples|tests)/[^`]+)`:$", prev)
        if f:
            path = os.path.join(src, f.group(1))
            if not os.path.exists(path):
                print(f"{doc}:{start + 1}: {f.group(1)} does not exist")
                bad += 1
            elif open(path).read() != body:
                print(f"{doc}:{start + 1}: block differs from {f.group(1)}")
                bad += 1
        elif lang == "sh":
            n += 1
            kind = "parse" if prev.startswith("<!-- not run") else "run"
            with open(os.path.join(out, "%03d.%s" % (n, kind)), "w") as o:
                o.write(f"# {doc}:{start + 1}\n" + body)
        i = j + 1
sys.exit(1 if bad else 0)
EOF
	bad "the docs' file blocks differ from the files"

# Free ports for the fixed ones in the docs, picked again right before each
# block: picked once, a port sat free for minutes while the other suites'
# connections drew ephemeral ports from the same range.
free_ports() {
	read -r p1 p2 p3 p4 p5 p6 p7 p8 < <(python3 -c '
import socket
s = [socket.socket() for _ in range(8)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
}
free_ports

cd "$work" || exit 1
# training.md: 6 commands; deploy.md: 4, and 4 that are only parsed;
# operations.md: 2; bench.md: 1, and 1 only parsed.
[ "$(ls blocks/*.run | wc -l)" -ge 13 ] &&
	[ "$(ls blocks/*.parse | wc -l)" -ge 5 ] ||
	bad "fewer doc blocks than expected: $(ls blocks)"
for b in blocks/*.parse; do
	bash -n "$b" || bad "does not parse: $(head -n 1 "$b")"
done
for b in blocks/*.run; do
	free_ports
	sed -e "s/\b8081\b/$p1/g" -e "s/\b7164\b/$p2/g" -e "s/\b7174\b/$p3/g" \
		-e "s/\b6170\b/$p4/g" -e "s/\b6171\b/$p5/g" \
		-e "s/\b9464\b/$p6/g" -e "s/\b2379\b/$p7/g" \
		-e "s/\b2380\b/$p8/g" "$b" >"$b.sh"
	setsid timeout 120 bash -euo pipefail "$b.sh" >"$b.out" 2>&1 &
	groups="$groups $!"
	t0=$SECONDS
	wait $!
	rc=$?
	if [ $rc != 0 ]; then
		bad "$(head -n 1 "$b" | cut -c3-) exits $rc after $((SECONDS - t0)) s$([ $rc = 124 ] && echo ' (timed out)'):"
		tail -n 20 "$b.out" >&2
		# What the block wrote: its own files and its jobs' logs,
		# newest first (the failing block's are the newest).
		for l in $(ls -t *.txt *.log log*/*.log 2>/dev/null | head -n 12); do
			echo "--- $l" >&2
			tail -n 8 "$l" >&2
		done
	fi
	kill -- -"${groups##* }" 2>/dev/null
done

# An after-train command that is not found says so, once.
embstore launch --server_num 1 --worker_num 1 --log-dir log.after -- \
	build/examples/ctr/train --data data/train.tsv --epochs 1 \
	--after-train 'no-such-program --out x' >after.out 2>&1 &&
	bad "a missing after-train command did not fail the launch"
grep -q 'after-train command not found (exit 127): no-such-program' \
	after.out || bad "no clear after-train message: $(tail -n 5 after.out)"
grep -q 'internal error' after.out && bad "after-train: internal error"

# Slurm: the batch script with srun and scontrol that run every task on
# this machine.
mkdir -p shims
cat >shims/srun <<'EOF'
#!/bin/bash
# srun stand-in: runs --ntasks copies of the command here.
n=1
while [[ $1 == -* ]]; do
	case $1 in
	--ntasks=*) n=${1#--ntasks=} ;;
	-n) n=$2; shift ;;
	esac
	shift
done
pids=()
for ((i = 0; i < n; i++)); do
	SLURM_PROCID=$i "$@" &
	pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
EOF
cat >shims/scontrol <<'EOF'
#!/bin/bash
# scontrol stand-in: "show hostnames" lists SLURM_NNODES of this machine.
for ((i = 0; i < SLURM_NNODES; i++)); do echo 127.0.0.1; done
EOF
chmod +x shims/srun shims/scontrol
mkdir slurm && cd slurm && ln -s ../build ../data . 2>/dev/null
setsid timeout 120 env PATH="$work/shims:$PATH" SLURM_JOB_NODELIST='n[1-4]' \
	SLURM_NNODES=4 EMB_SCHED_PORT="$p1" LISTEN=127.0.0.1:0 \
	bash "$SRC/deploy/slurm/embstore.sbatch" >out 2>&1 &
groups="$groups $!"
wait $! || { bad "deploy/slurm/embstore.sbatch:"; tail -n 20 out >&2; }
[ "$(grep -c '^worker [01]: [0-9]* samples' out)" -eq 2 ] ||
	bad "slurm job: not two workers trained: $(tail -n 5 out)"
cd "$work" || exit 1

# Kubernetes: the objects a job needs, probes on /healthz, and options the
# programs take.
python3 - "$SRC/deploy/kubernetes/embstore.yaml" "$BUILD" <<'EOF' ||
import subprocess, sys
try:
    import yaml
except ImportError:
    sys.exit(0)
docs = list(yaml.safe_load_all(open(sys.argv[1])))
kinds = [d["kind"] for d in docs]
for k in ("Secret", "Service", "StatefulSet", "Job"):
    assert k in kinds, "no " + k
assert any(d["kind"] == "Service" and d["spec"].get("clusterIP") == "None"
           for d in docs), "no headless service"
progs = {"embstore-server": sys.argv[2] + "/tools/embstore-server",
         "train": sys.argv[2] + "/examples/ctr/train"}
for d in docs:
    if d["kind"] not in ("StatefulSet", "Job"):
        continue
    pod = d["spec"]["template"]["spec"]
    vols = {v["name"] for v in pod.get("volumes", [])}
    assert any("secret" in v for v in pod.get("volumes", [])), \
        d["metadata"]["name"] + ": no token secret"
    for c in pod["containers"]:
        if d["kind"] == "StatefulSet":
            p = c["readinessProbe"]["httpGet"]
            assert p["path"] == "/healthz", c["name"]
        for m in c.get("volumeMounts", []):
            assert m["name"] in vols, m
        cmd = c["command"]
        h = subprocess.run([progs[cmd[0]], "--help"], capture_output=True,
                           text=True)
        usage = h.stdout + h.stderr
        for a in cmd[1:]:
            if a.startswith("--"):
                assert a in usage, f"{cmd[0]} takes no {a}"
EOF
	bad "deploy/kubernetes/embstore.yaml"

# systemd: the unit verifies (where systemd-analyze exists), and a server
# runs from server.env with the test's addresses and directories.
mkdir unit && sed -e "s|/usr/local/bin/embstore-server|$BUILD/tools/embstore-server|" \
	-e "s|/etc/embstore/server.env|$work/unit/server.env|" \
	"$SRC/deploy/systemd/embstore-server.service" >unit/embstore-server.service
cp "$SRC/deploy/systemd/server.env" unit/
if command -v systemd-analyze >/dev/null 2>&1; then
	systemd-analyze verify unit/embstore-server.service >unit/verify 2>&1 ||
		{ bad "systemd-analyze verify:"; cat unit/verify >&2; }
fi
echo secret-token >unit/token
(
	set -a
	. unit/server.env
	set +a
	EMB_LISTEN=127.0.0.1:0 EMB_METRICS_LISTEN=127.0.0.1:0 \
		EMB_CHECKPOINT_DIR=$work/unit/ckpt EMB_AUTH_TOKEN_FILE=$work/unit/token \
		exec "$BUILD/tools/embstore-server"
) >unit/server.log 2>&1 &
spid=$!
ok=
for _ in $(seq 100); do
	mp=$(sed -n 's|.*metrics on http://127\.0\.0\.1:\([0-9]*\)/.*|\1|p' \
		unit/server.log)
	[ -n "$mp" ] && ok=$(python3 -c "
import urllib.request
print(urllib.request.urlopen('http://127.0.0.1:$mp/healthz').read().decode())" \
		2>/dev/null) && break
	sleep 0.1
done
[ "$ok" = ok ] || bad "server from server.env not healthy: $(cat unit/server.log)"
kill "$spid"
wait "$spid" || bad "server from server.env did not exit 0 on SIGTERM"
ls unit/ckpt/* >/dev/null 2>&1 || bad "no final checkpoint in EMB_CHECKPOINT_DIR"
exit $fail
