#!/usr/bin/env bash
# run.sh - build, test and try embstore from a checkout.
#
#   ./run.sh demo           build, then train the PyTorch CTR example on a local
#                           cluster, dump the trained tables and inspect the dump
#   ./run.sh demo-c         the same with the C CTR example
#   ./run.sh store-bench    build, then run the store benchmark (W1) and print figures
#   ./run.sh test           build, then run every test suite; ends with "N passed, N failed"
#   ./run.sh build          install missing packages, configure and build
#   ./run.sh install [DIR]  build, then install the programs, library and headers
#                           under DIR (default /usr/local: embstore, embstore-server
#                           and embstore-bench in /usr/local/bin)
#   ./run.sh bench ARGS...  build, then run tools/embstore-bench with ARGS
#   ./run.sh deps           install missing Debian packages only
#
# Every command first installs missing Debian packages (as root; otherwise it
# prints the apt-get line to run and stops) and builds with meson + ninja.
#
# Environment:
#   EMB_BUILD_DIR      build directory (default: build)
#   EMB_MESON_ARGS     extra `meson setup` arguments for a new build directory,
#                      e.g. "-Db_sanitize=address,undefined -Db_lundef=false"
#   EMB_TEST_ARGS      extra `meson test` arguments (e.g. "--suite store")
#   EMB_NINJA_JOBS     compile jobs at once (default: ninja's, the cores + 2)
#   EMB_DEMO_DURATION  seconds per demo run (default: 5)
#   EMB_PYTHON         the Python interpreter (default: /usr/bin/python3, which
#                      sees Debian's python3-torch, or else the first python3
#                      in PATH that imports torch)
set -euo pipefail

cd "$(dirname "$0")"

BUILD=${EMB_BUILD_DIR:-build}
PACKAGES=(build-essential meson ninja-build pkg-config libibverbs-dev
          librdmacm-dev libjemalloc-dev liblz4-dev libcunit1-dev
          libxxhash-dev libmicrohttpd-dev libcurl4-openssl-dev
          libcjson-dev liburing-dev etcd-server etcd-client clang
          python3-numpy python3-torch python3-pytest jq
          stress-ng   # CPU load beside tests (.ci/run, tests/chaos)
          fio         # the device's read rate beside the tier's (tools/bench-tier.sh)
          # the tier's baseline, the same workload on RocksDB
          # (embstore-bench-rocks, tools/bench-tier.sh; built where found)
          librocksdb-dev
          # pip install . and wheels (pyproject.toml, tests/python/test_pip.py)
          python3-mesonpy python3-build python3-venv python3-pip)

die() {
    echo "run.sh: $*" >&2
    exit 1
}

missing_packages() {
    local p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null |
            grep -q '^install ok installed$' || echo "$p"
    done
}

cmd_deps() {
    local missing
    if ! command -v dpkg-query >/dev/null; then
        echo "run.sh: not a Debian system; make sure these are installed:" \
             "${PACKAGES[*]}" >&2
        return 0
    fi
    mapfile -t missing < <(missing_packages)
    ((${#missing[@]} == 0)) && return 0
    if ((EUID != 0)); then
        echo "run.sh: missing Debian packages: ${missing[*]}" >&2
        echo "run.sh: run as root:" >&2
        echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
    echo "run.sh: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y "${missing[@]}"
}

cmd_build() {
    cmd_deps
    if [[ ! -f $BUILD/build.ninja ]]; then
        # shellcheck disable=SC2086  # EMB_MESON_ARGS is a list of options
        meson setup "$BUILD" ${EMB_MESON_ARGS:-}
    fi
    ninja -C "$BUILD" ${EMB_NINJA_JOBS:+-j "$EMB_NINJA_JOBS"}
}

# Reads a `meson test` log and prints "OK FAIL SKIP" counts. Expected Fail
# counts as passed; Fail, Unexpected Pass and Timeout as failed.
meson_counts() {
    awk -F: '
        /^Ok:/              { ok += $2 }
        /^Expected Fail:/   { ok += $2 }
        /^Fail:/            { bad += $2 }
        /^Unexpected Pass:/ { bad += $2 }
        /^Timeout:/         { bad += $2 }
        /^Skipped:/         { skip += $2 }
        END { printf "%d %d %d\n", ok, bad, skip }' "$1"
}

cmd_test() {
    local log rc ok bad skip
    cmd_build
    log=$(mktemp)
    trap 'rm -f "$log"' RETURN
    set +e
    # shellcheck disable=SC2086  # EMB_TEST_ARGS is a list of options
    meson test -C "$BUILD" --print-errorlogs ${EMB_TEST_ARGS:-} 2>&1 |
        tee "$log"
    rc=${PIPESTATUS[0]}
    set -e
    read -r ok bad skip < <(meson_counts "$log")
    # meson failing without a failed test (e.g. a rebuild error) still fails.
    if ((rc != 0 && bad == 0)); then
        bad=1
    fi
    echo
    echo "$skip skipped"
    echo "$ok passed, $bad failed"
    ((bad == 0))
}

# The interpreter for the Python package and the PyTorch example: Debian's
# /usr/bin/python3 sees the python3-* packages installed above, while a
# python3 earlier in PATH (pyenv, a venv) may not.
find_python() {
    local p
    if [[ -n ${EMB_PYTHON:-} ]]; then
        echo "$EMB_PYTHON"
        return
    fi
    for p in /usr/bin/python3 $(type -ap python3); do
        if "$p" -c 'import numpy, torch' 2>/dev/null; then
            echo "$p"
            return
        fi
    done
    die "no python3 imports numpy and torch: ./run.sh deps (as root)"
}

cmd_install() {
    local prefix=${1:-/usr/local}
    cmd_build
    meson configure "$BUILD" -Dprefix="$prefix" >/dev/null
    meson install -C "$BUILD" --quiet
    echo "run.sh: installed under $prefix; programs in $prefix/bin"
}

cmd_bench() {
    cmd_build
    exec "$BUILD/tools/embstore-bench" "$@"
}

# Value of a top-level key in embstore-bench's one-line JSON (flat object).
json_get() {
    sed -n "s/.*\"$1\":\"\{0,1\}\([^,\"}]*\).*/\1/p" <<<"$2"
}

# W1: one in-process table of 1M rows x 64 floats, batches of 4096 ids, one
# thread, SGD. The raw-* ops run the same id stream on a dense array: the
# store's targets are pull >= 0.6x raw-gather and push >= 0.6x raw-apply.
cmd_store_bench() {
    local dur=${EMB_DEMO_DURATION:-5} bench dist op line
    local -A rate
    cmd_build
    bench=$BUILD/tools/embstore-bench
    echo
    echo "W1: in-process store, 1000000 rows x 64 floats, batch 4096," \
         "1 thread, sgd, ${dur} s per run"
    printf '%-11s %-10s %9s %8s %8s %8s %8s %8s %9s\n' op dist 'Mrows/s' \
           'MB/s' 'p50 us' 'p99 us' 'B/row' 'RSS B/r' 'uniq/bat'
    for dist in zipf:1.05 uniform; do
        for op in pull push step raw-gather raw-apply; do
            line=$("$bench" --in-process --rows 1000000 --dim 64 \
                   --batch 4096 --threads 1 --optimizer sgd --dist "$dist" \
                   --op "$op" --duration "$dur" --json 2>/dev/null) ||
                die "embstore-bench --op $op --dist $dist failed"
            rate[$op,$dist]=$(json_get rows_per_s "$line")
            printf '%-11s %-10s %9.2f %8.0f %8.1f %8.1f %8.1f %8.1f %9.0f\n' \
                   "$op" "$dist" \
                   "$(awk -v r="${rate[$op,$dist]}" 'BEGIN { print r / 1e6 }')" \
                   "$(json_get mb_per_s "$line")" \
                   "$(json_get p50_us "$line")" \
                   "$(json_get p99_us "$line")" \
                   "$(json_get bytes_per_row "$line")" \
                   "$(json_get rss_bytes_per_row "$line")" \
                   "$(json_get unique_per_batch "$line")"
        done
    done
    echo
    for dist in zipf:1.05 uniform; do
        awk -v d="$dist" -v p="${rate[pull,$dist]}" \
            -v g="${rate[raw-gather,$dist]}" -v u="${rate[push,$dist]}" \
            -v a="${rate[raw-apply,$dist]}" 'BEGIN {
                printf "%-10s pull/raw-gather %.2fx   push/raw-apply %.2fx" \
                       "   (targets >= 0.60x)\n", d, p / g, u / a }'
    done
}

# A demo run: generated Criteo-format data, the trainer TRAINER... once in
# one process (--local, the baseline), then on a local cluster (scheduler, 2
# servers, 2 workers) where worker 0 dumps the trained tables while the
# servers still hold them; the dump is inspected. $1 names the trainer.
run_demo() {
    local what=$1 out=${EMB_DEMO_DIR:-out/demo} rows=${EMB_DEMO_ROWS:-200000}
    local bin=$BUILD/tools ex=$BUILD/examples/ctr t
    shift
    rm -rf "$out"
    mkdir -p "$out"
    echo
    echo "== data: $rows Criteo-format lines with a planted truth"
    "$ex/gen" --rows "$rows" --seed 1 --out "$out/data"
    echo
    echo "== baseline: $what trained in one process (--local)"
    "$@" --local --data "$out/data/train.tsv" \
        --test "$out/data/test.tsv" --epochs 2 --log-every 50
    echo
    echo "== embstore: scheduler + 2 servers + 2 workers (logs in $out/log)"
    EMB_LOG_LEVEL=${EMB_LOG_LEVEL:-warn} "$bin/embstore" launch \
        --server_num 2 --worker_num 2 --log-dir "$out/log" -- \
        "$@" --data "$out/data/train.tsv" \
        --test "$out/data/test.tsv" --epochs 2 --log-every 25 \
        --after-train "mkdir -p '$out/dump' && for t in ctr_emb ctr_wide ctr_mlp; do '$bin/embstore' dump --table \$t --out '$out/dump'/\$t || exit 1; done"
    echo
    echo "== the dump, verified"
    for t in ctr_emb ctr_wide ctr_mlp; do
        "$bin/embstore" inspect "$out/dump/$t"
    done
}

# The main job: the PyTorch CTR example (examples/torch/train.py).
cmd_demo() {
    local py
    cmd_build
    py=$(find_python)
    # The package from this checkout, over the library just built.
    export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
    EMBSTORE_LIB=$(cd "$BUILD" && pwd)/src/worker/libembstore.so
    export EMBSTORE_LIB
    run_demo "the PyTorch model ($py; torch.nn embeddings locally)" \
        "$py" examples/torch/train.py
}

# The same with the C example (examples/ctr/train).
cmd_demo_c() {
    cmd_build
    run_demo "the C wide & deep model" "$BUILD/examples/ctr/train"
}

case ${1:-} in
deps) cmd_deps ;;
build) cmd_build ;;
test) cmd_test ;;
demo) cmd_demo ;;
demo-c) cmd_demo_c ;;
store-bench) cmd_store_bench ;;
install) shift; cmd_install "$@" ;;
bench) shift; cmd_bench "$@" ;;
*)
    sed -n '2,14s/^# \{0,1\}//p' "$0" >&2
    exit 2
    ;;
esac
