# Sourced by the scripts/bench*.sh benchmarks: what each of them does the same way
# (the repository root as the working folder, GNU time, the release build, medians).
# Not a benchmark itself.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# devmap asks no Python for transformers' view of the model: that is one Python start
# before the work (about 0.1 s here through a pyenv shim, cached answers after), the
# same for a model of any size, while these benchmarks measure the bytes. What the
# probe costs is measured on its own (docs/performance.md, "Fixed costs").
export DEVMAP_PYTHON=none

# Peak RSS comes from GNU time's %M: the shell's `time` keyword does not report it.
need_gnu_time() {
    command -v /usr/bin/time >/dev/null || {
        echo "needs GNU time (apt-get install time)" >&2
        exit 1
    }
}

# build_release [EXAMPLE...]: the release binary, as $DEVMAP, and the named examples
# (target/release/examples/NAME).
build_release() {
    local args=()
    for example in "$@"; do args+=(--example "$example"); done
    cargo build --release --quiet --bin devmap "${args[@]}"
    DEVMAP=target/release/devmap
}

# timed CMD...: runs CMD with its output dropped; prints "seconds peak_rss_kib".
# A command that fails stops the benchmark (a failed run's time means nothing).
timed() {
    local report
    report=$(mktemp)
    if ! /usr/bin/time -f "%e %M" -o "$report" "$@" > /dev/null 2>&1; then
        echo "failed: $*" >&2
        tail -3 "$report" >&2
        rm -f "$report"
        return 1
    fi
    tail -1 "$report"
    rm -f "$report"
}

# median: the median line of standard input, ordered by its first number.
median() { sort -n | awk '{line[NR] = $0} END {print line[int((NR + 1) / 2)]}'; }

# median_run RUNS PREP CMD...: PREP (a command, often a function that warms the page
# cache or removes the last run's output), then CMD, RUNS times; prints the
# "seconds peak_rss_kib" of the median run.
median_run() {
    local runs=$1 prep=$2
    shift 2
    local i
    for i in $(seq "$runs"); do
        $prep
        timed "$@"
    done | median
}

# ratio A B: A / B to two decimals.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }

# side_by_side RUNS PREP_A RUN_A PREP_B RUN_B: the two commands (shell functions taking
# no arguments) RUNS times, alternating, each after its PREP, so a drift of the
# machine's speed reaches both alike; prints "seconds_a peak_rss_kib_a seconds_b
# ratio least most": the medians of each one's seconds (to the millisecond) and of the
# runs' ratios a / b, then the least and the most of those ratios (on a shared host
# their spread can be wider than a change being measured).
side_by_side() {
    local runs=$1 prep_a=$2 run_a=$3 prep_b=$4 run_b=$5
    local i a b rss_a
    # GNU time runs a program: the functions go to it through the environment.
    export -f "$run_a" "$run_b"
    for i in $(seq "$runs"); do
        $prep_a
        read -r a rss_a < <(timed_ms bash -c "$run_a")
        $prep_b
        read -r b _ < <(timed_ms bash -c "$run_b")
        echo "$a $rss_a $b $(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.3f", a / b}')"
    done | awk '{a[NR] = $1; r[NR] = $2; b[NR] = $3; q[NR] = $4}
        function med(x,   n, i, j, t) {
            n = NR
            for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (x[j] < x[i]) { t = x[i]; x[i] = x[j]; x[j] = t }
            return x[int((n + 1) / 2)]
        }
        END { m = med(q); printf "%.3f %d %.3f %.2f %.2f %.2f\n", med(a), med(r), med(b), m, q[1], q[NR] }'
}

# timed_ms CMD...: as `timed`, the seconds to the millisecond (from the clock around
# GNU time, which reports hundredths).
timed_ms() {
    local start end report
    report=$(mktemp)
    start=$(date +%s%N)
    if ! /usr/bin/time -f "%M" -o "$report" "$@" > /dev/null 2>&1; then
        echo "failed: $*" >&2
        rm -f "$report"
        return 1
    fi
    end=$(date +%s%N)
    echo "$(awk -v d="$((end - start))" 'BEGIN {printf "%.3f", d / 1e9}') $(tail -1 "$report")"
    rm -f "$report"
}
