#!/usr/bin/env bash
# Validate libgpushare.so on a machine with an NVIDIA GPU, its driver and PyTorch (an H100/H200
# lent for about 10 minutes, the machine's start included). Builds the library and the probe,
# then checks against the real driver, section by section, in this order (the sections never
# measured on hardware before the ones the H100 measured on 2026-11-28):
#  10. MIG, read only (issue 42): the GPU's MIG mode from nvidia-smi (current, pending; recorded),
#      then `gpushare-dra discover` on the GPU's NVML as a plugin with --mig-gpus none and with
#      --mig-gpus GPU would publish: MIG mode off, the GPU's devices the same either way and the
#      plugin's note saying why it offers no MIG devices; MIG mode on (an operator's choice, left
#      as it is), its profile placements as MIG devices and nothing when not named; the MIG mode
#      unchanged after. Nothing here sets a MIG mode or makes or destroys an instance. --sim also
#      runs it on a simulated GPU in MIG mode (the simulator's H100 80GB table)
#   1. the probe: OOM at the limit, cuMemGetInfo/NVML report the limit
#   2. PyTorch: allocations past the limit raise torch.cuda.OutOfMemoryError,
#      torch.cuda.mem_get_info shows the limit
#   3. two processes on one region share the budget
#   4. compute shares (issue 10; the node agent's slots running as in a cluster, through
#      `gpushare-dra share-agent` over the run dirs): first every PyTorch kind's solo speed in
#      one process (hack/gpu-validate-work.py solo, SOLO_SECONDS each; with --out also the
#      torch.profiler captures, below), then 30/70 with matmul, elementwise and mixed kernels
#      within 3 points of each claim's share of solo speed, the pair >= 90 % of solo;
#      torch.cuda.graph capture and replay, torch.compile reduce-overhead and a Triton kernel (one
#      process, each in turn) and a JAX jit loop alone at 50 within 3 points; Burst 30 alone
#      >= 90 %; an inference-like client's p50/p99 solo, beside a busy neighbour without the
#      library, and under the library at 50/50 (p50 <= 1.2x solo, p99 <= plain time slicing)
#   5. launch overhead with and without the library; the probe's busy share at compute 50
#   8. a transformer training pair (hack/gpu-validate-work.py train: 8 layers, d_model 1024,
#      16 heads, sequence 512, batch 8, bf16 autocast, AdamW, random tokens made on the host
#      each step, the loss read with .item()), steps per second: solo, two processes without the
#      library (plain time slicing), Hard 30/70 claims under the library and the share agent;
#      each claim >= its share of solo - 3, together >= 0.95 x the plain pair
#   9. the framework-shaped traces of hook/traces replayed by `gpushare-probe replay` (spin
#      kernels on the real GPU): train-transformer.trace and train-transformer-h200.trace (the
#      H200's capture of section 8's step) at 30/70 (together >= 0.95 x the plain pair, each
#      claim's part at most what its limit allows: limit / the step's busy % alone); elementwise.trace
#      at 70 beside a `launch --kernel-us 2650` claim at 30 (each >= its share of solo - 3, together
#      >= 0.95 x the plain pair); serve-mlp.trace at 50 beside a busy launch claim at 50 (p50
#      <= 1.2x solo, p99 <= plain time slicing, the busy claim >= 47 % of solo). Beside every
#      paced case: the same processes without the library (plain time slicing)
#   6. MPS (issue 20): an nvidia-cuda-mps-control daemon with its own pipe directory; 30/70
#      matmul clients (each lowering the server's 100 % with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE):
#      the 30-client's part of the pair's work within 3 points, the pair's work vs solo
#      recorded (H100: 75, 83.9 %); two small-kernel inference clients (batch-1 MLP) at 50/50 do
#      more than 1.5x one alone; a server at 30 holds a client whose variable says 100 to
#      MPS_HELD x 30 % of solo (0.82 x 30 = 24.6: a kernel held to fewer SMs than its grid asks
#      for runs at 0.82 of them, docs/compute.md "MPS", kubeletplugin/hooklayout.py SIM_MPS_HELD;
#      the H100: 24.6, 25.1) and a client at 10 to 0.82 x 10; the library under an MPS claim's
#      limits file (a client at the claim's 30 % and two processes of it together at 0.82 x 30,
#      unheld by the library; a plain context paced to 30); an inference client's p50/p99
#      beside a busy one; `priority: Latency`: the client (CUDA_MPS_CLIENT_PRIORITY 0) beside a
#      Batch matmul (1), p99 <= 1.5x alone
#   7. issue 29: the simulator's calibration figures (two busy contexts, a kernel's event pair
#      beside a busy one, a client's latency, the launch rate) and the untuned share cases of
#      hack/bench-share, with the probe (on a GPU the basic case and the three the H100 left
#      open; UNTUNED=all: all eight, as --sim runs them)
# The kernel-trace captures (with --out, in the solo run of section 4 or 8): the training step,
# the elementwise loop and the batch-1 MLP client, five steps each under torch.profiler (three
# recorded), converted by hack/trace-from-profile.py into
# OUT/profiled-{train-transformer,elementwise,serve-mlp}.trace (the format of hook/traces:
# replay them on the simulator with `gpushare-probe replay --trace FILE --seconds T`), each
# replayed once on the GPU beside its PyTorch figures (recorded); the raw profiles in
# OUT/profiles.tar.gz.
#
# Each row prints as soon as it is measured ("SECTION ok|FAIL|skip CHECK DETAIL"); a workload
# that fails (its exit status, no figures, a timeout) is a FAIL row with its error, never the end
# of the script. A table of all rows at the end; exits 1 if a check failed, 2 if the setup did
# (no build, no GPU UUID, no share agent).
#
#   hack/gpu-validate.sh [--out DIR] [--sections LIST] [--budget S] [GPU index]
#   hack/gpu-validate.sh --mps-only [GPU index]   section 6 alone
#   hack/gpu-validate.sh --sim [--out DIR]        sections 10 1 3 5 9 6 7 on the simulated GPU
#       (hook/build/sim, its simulated MPS server, the probe's spin kernels instead of PyTorch);
#       the sections that need PyTorch (2, 4, 8) are refused there
#   --out DIR       DIR/gpu-validate.json (DIR made if missing): the machine (GPU name, driver,
#                   CUDA, torch and its versions, the SM count from the driver through the probe
#                   and from PyTorch, the git commit, the windows) and every row (section, case,
#                   check, target, measured values, ok/FAIL/skip), rewritten after each row and
#                   at exit ("complete": false while running or when cut off); the traces above
#   --sections LIST which sections, e.g. 4,8,9 (default: all; --sim: 1,3,5,6,7,9,10)
#   --budget S      past S seconds from the start, the cases not yet begun are skip rows
#                   (default 450; 0: none), so that a run ends within 8 minutes
# Environment: SHARE_SECONDS (5): the window of each share measurement (not SECONDS, which bash
# sets to the shell's age); SOLO_SECONDS (2): the window of each solo figure; START_LEAD (4):
# the seconds two PyTorch processes get to start before their common window (the training
# pair 3 more; one that is late says so in its row); UNTUNED=all: every untuned case of section
# 7 on a GPU; PYTHON: the workloads' python, python3 by default; AGENT_PYTHON: the share agent's
# (PYTHON by default). The agent needs this repo's packages and their structlog and pyyaml: when
# AGENT_PYTHON cannot import it, the script runs `AGENT_PYTHON -m pip install --target
# build/gpu-validate-site structlog pyyaml` (AGENT_WHEELS=DIR: --no-index --find-links DIR, for a
# machine with no network, e.g. the lent GPU machines: carry a structlog wheel) and runs the
# agent with that folder on PYTHONPATH. Section 10's `gpushare-dra discover` runs on the same
# python and needs nvidia-ml-py and kubernetes besides (installed the same way: carry their
# wheels and their dependencies' too). GIT_COMMIT: the commit to record where the copy has no
# .git.
#
# Time, at the defaults: --sim took 3 min 28 s and 3 min 32 s on a loaded 2-core machine
# (2026-11-28, before section 10; sections 1 3 5 9 6 7: 1-5 ~10 s, 9 ~60 s, 6 ~65 s, 7 ~70 s with all eight untuned
# cases); it has no PyTorch sections, so it is a lower bound. On a GPU, estimated from the windows and about 5 s to start each PyTorch
# process: the build and the machine's facts ~20 s, 1-3 ~12 s, the solo run with the captures
# ~70 s (torch.compile ~15 s of it), 4 ~110 s, 5 ~7 s, 8 ~30 s, 9 ~55 s, 6 ~110 s, 7 ~50 s:
# about 7.7 minutes (460 s), and 10 a few seconds (two `discover` runs; 14 s and 61 s with --sim's four on
# the loaded 2-core machine, 2026-11-28). The budget ends a slower run near 8 minutes (450 s, then the case
# under way; each run is killed after SHARE_SECONDS + START_LEAD + 150 s): what is left is a
# skip row each, section 7's last cases first; `--sections` splits a run over two windows.
# Before this rework the script took 13 minutes at SHARE_SECONDS=8.
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
SIM=0
SECTIONS=
OUTDIR=
BUDGET=${BUDGET_SECONDS:-450}
while [ $# -gt 0 ]; do
    case $1 in
        --sim) SIM=1 ;;
        --mps-only) SECTIONS=6 ;;
        --sections) SECTIONS=${2:-}; shift ;;
        --sections=*) SECTIONS=${1#*=} ;;
        --out) OUTDIR=${2:-}; shift ;;
        --out=*) OUTDIR=${1#*=} ;;
        --budget) BUDGET=${2:-}; shift ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "gpu-validate: unknown option $1 (expected --sim, --mps-only, --sections, --out, --budget, a GPU index)" >&2; exit 64 ;;
        *) break ;;
    esac
    shift
done
GPU=${1:-0}
SECTIONS=$(echo "${SECTIONS:-$([ "$SIM" = 1 ] && echo 1,3,5,6,7,9,10 || echo 1,2,3,4,5,6,7,8,9,10)}" | tr ',' ' ')
for s in $SECTIONS; do
    [[ "$s" =~ ^([1-9]|10)$ ]] || { echo "gpu-validate: no section $s (1 to 10)" >&2; exit 64; }
    if [ "$SIM" = 1 ] && [[ " 2 4 8 " == *" $s "* ]]; then
        echo "gpu-validate: section $s needs PyTorch on a GPU; --sim runs 1 3 5 6 7 9 10" >&2; exit 64
    fi
done
W=${SHARE_SECONDS:-5}
S=${SOLO_SECONDS:-2}
PS=2                              # the probe's solo figures: its spin kernels' rate settles at once
LEAD=${START_LEAD:-4}
for v in "$W" "$S" "$LEAD" "$BUDGET" "$GPU"; do
    [[ "$v" =~ ^[0-9]+$ ]] || { echo "gpu-validate: '$v' is not a whole number of seconds (or a GPU index)" >&2; exit 64; }
done
TMO=$((W + LEAD + 150))           # a run still going after this is killed (a FAIL row that says so)
LIMIT=$((2 * 1024 * 1024 * 1024)) # 2 GiB: every claim's memory limit but the training pair's
TRAIN_LIMIT=$((24 * 1024 * 1024 * 1024))
SECONDS=0
WORK=$(mktemp -d)
PY=${PYTHON:-python3}             # the workloads' python (PyTorch, JAX, Triton where installed)
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX takes memory as it needs it, under a claim's limit too
WPY=$REPO/hack/gpu-validate-work.py
LIB=$REPO/hook/build/libgpushare.so
PROBE=$REPO/hook/build/gpushare-probe
want() { [[ " $SECTIONS " == *" $1 "* ]]; }

# ---- rows, printed at once and written to OUTDIR/gpu-validate.json ----
ROWS=()      # each row's JSON object
LINES=()     # each row's text line, for the table at the end
FACTS=()     # "key": value pairs
NOK=0 NFAIL=0 NSKIP=0
SECTION=-
CASE=
COMPLETE=false
jstr() {  # a JSON string
    local s=$1
    s=${s//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\n'/\\n}; s=${s//$'\t'/ }
    [[ "$s" == *[[:cntrl:]]* ]] && s=$(tr -d '[:cntrl:]' <<< "$s")
    printf '"%s"' "$s"
}
jval() {  # a JSON number, string, or null for nothing
    if [[ "$1" =~ ^-?(0|[1-9][0-9]*)([.][0-9]+)?$ ]]; then printf '%s' "$1"; elif [ -z "$1" ]; then printf null; else jstr "$1"; fi
}
fact() { FACTS+=("$(jstr "$1"): $(jval "$2")"); }
write_json() {  # [EXIT STATUS]
    [ -n "$OUTDIR" ] || return 0
    local f=$OUTDIR/gpu-validate.json sep="" r
    {
        printf '{\n"tool": "hack/gpu-validate.sh",\n"complete": %s,\n"exit_status": %s,\n"elapsed_s": %d,\n' \
            "$COMPLETE" "${1:-null}" "$SECONDS"
        printf '"counts": {"ok": %d, "fail": %d, "skip": %d},\n"facts": {' "$NOK" "$NFAIL" "$NSKIP"
        for r in "${FACTS[@]}"; do printf '%s\n  %s' "$sep" "$r"; sep=,; done
        printf '\n},\n"rows": ['
        sep=""
        for r in "${ROWS[@]}"; do printf '%s\n  %s' "$sep" "$r"; sep=,; done
        printf '\n]}\n'
    } > "$f.tmp" && mv -f "$f.tmp" "$f"
}
check() {  # NAME OK(1|0|skip) DETAIL [TARGET [KEY=VALUE...]]: one row, printed and written at once
    local name=$1 ok=$2 detail=$3 target=${4:-} status kv m="" okj
    shift 3; [ $# -gt 0 ] && shift
    case $ok in
        1) status=ok; okj=true; NOK=$((NOK + 1)) ;;
        skip) status=skip; okj=null; NSKIP=$((NSKIP + 1)) ;;
        *) status=FAIL; okj=false; NFAIL=$((NFAIL + 1)) ;;
    esac
    for kv in "$@"; do m+="${m:+, }$(jstr "${kv%%=*}"): $(jval "${kv#*=}")"; done
    local line; line=$(printf '%-5s %-4s %-62s %s' "$SECTION" "$status" "$name" "$detail")
    echo "$line"
    LINES+=("$line")
    ROWS+=("{\"section\": $(jstr "$SECTION"), \"case\": $(jstr "$CASE"), \"check\": $(jstr "$name"), \"status\": \"$status\", \"ok\": $okj, \"target\": $(jstr "$target"), \"measured\": {$m}, \"detail\": $(jstr "$detail"), \"t_s\": $SECONDS}")
    write_json
}
over_budget() { [ "$BUDGET" != 0 ] && [ "$SECONDS" -ge "$BUDGET" ]; }
begin_case() {  # NAME: the case's rows are named after it; 1 (and a skip row) past the budget
    CASE=$1
    if over_budget; then check "$CASE" skip "not run: past the time budget (${BUDGET} s)" "" ; return 1; fi
}
section() {  # N TITLE: 0 if the section runs
    want "$1" || return 1
    SECTION=$1 CASE=
    echo
    echo "== $1. $2 (at ${SECONDS} s)"
    if over_budget; then check "section $1: $2" skip "not run: past the time budget (${BUDGET} s)"; return 1; fi
}

# ---- numbers (every helper answers something for a missing figure: a row fails, not the script) ----
num() { [[ "${1:-}" =~ ^-?[0-9]+([.][0-9]+)?$ ]]; }
val() { grep -o "$1=[^ ]*" | tail -1 | cut -d= -f2; }
pct() { num "${1:-}" && num "${2:-}" && awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) exit 1; printf "%.1f", 100 * a / b }'; }
sum() { num "${1:-}" && num "${2:-}" && awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", a + b }'; }
within() { num "${1:-}" && awk -v g="$1" -v t="$2" -v b="$3" 'BEGIN { print ((g >= t - b && g <= t + b) ? 1 : 0) }' || echo 0; }
atleast() { num "${1:-}" && num "${2:-}" && awk -v g="$1" -v t="$2" 'BEGIN { print ((g >= t) ? 1 : 0) }' || echo 0; }
atmost() { num "${1:-}" && num "${2:-}" && awk -v g="$1" -v t="$2" 'BEGIN { print ((g <= t) ? 1 : 0) }' || echo 0; }
times() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a * b }'; }
now() { echo "${EPOCHREALTIME:-$(date +%s.%N)}"; }
at_in() { awk -v t="$(now)" -v n="$1" 'BEGIN { printf "%.3f", t + n }'; }

# ---- runs: each under a timeout, its output in BASE.out/.err, its exit status in BASE.rc ----
plain() { timeout -k 5 "$TMO" env CUDA_VISIBLE_DEVICES="$GPU" "$@"; }
under() { local d=$1; shift; timeout -k 5 "$TMO" env CUDA_VISIBLE_DEVICES="$GPU" GPUSHARE_RUN_DIR="$d" LD_PRELOAD="$LIB" "$@"; }
go() {  # BASE plain|under|env... ARGS...
    local base=$1 rc; shift
    "$@" > "$base.out" 2> "$base.err"; rc=$?
    echo "$rc" > "$base.rc"
    [ "$rc" = 124 ] && echo "timed out after ${TMO} s" >> "$base.err"
    return "$rc"
}
why() {  # BASE: what went wrong, in a line
    local e
    e=$(grep -ho 'error=[^ ]*' "$1.out" 2>/dev/null | tail -1)
    [ -n "$e" ] || e=$(grep -v '^[[:space:]]*$' "$1.err" 2>/dev/null | grep -iv 'warn' | tail -1)
    [ -n "$e" ] || e=$(grep -v '^[[:space:]]*$' "$1.err" 2>/dev/null | tail -1)
    echo "exit $(cat "$1.rc" 2>/dev/null || echo '?'): ${e:-no output}" | cut -c1-300
}
rate_of() {  # BASE: work per second of a gpu-validate-work.py run, nothing if it did none
    local i; i=$(val iters < "$1.out" 2>/dev/null)
    [[ "$i" =~ ^[1-9][0-9]*$ ]] && val per_s < "$1.out"
}
lps_of() { local r; r=$(val launches_per_s < "$1.out" 2>/dev/null); num "$r" && [ "$r" != 0.0 ] && echo "$r"; }
sps_of() { local r; r=$(val steps_per_s < "$1.out" 2>/dev/null); num "$r" && [ "$r" != 0.00 ] && echo "$r"; }
sol() { if [ -n "${1:-}" ]; then echo "$1% of solo"; else echo "no figure (${2:-})"; fi; }  # PCT WHY
fig() { if [ -n "${1:-}" ]; then echo "$1"; else echo "no figure ($(why "$2"))"; fi; }  # VALUE BASE
late_of() { local l; l=$(val late_s < "$1.out" 2>/dev/null); awk -v l="${l:-0}" 'BEGIN { if (l > 0.2) printf " (started %.1f s late)", l }'; }

# claim DIR COMPUTE [POLICY] [MEMORY]: a run dir laid out as docs/interfaces.md says (UUID: the GPU's)
claim() {
    mkdir -p "$1/region"
    cat > "$1/limits" <<LIMITS
GPUSHARE_LIMITS_VERSION=1
GPUSHARE_GPU_COUNT=1
GPUSHARE_DEVICE_UUID_0=$UUID
GPUSHARE_MEMORY_LIMIT_0=${4:-$LIMIT}
GPUSHARE_COMPUTE_LIMIT_0=$2
GPUSHARE_COMPUTE_POLICY_0=${3:-Hard}
LIMITS
    truncate -s 1M "$1/region/0"
}

# ---- the share agent: the node agent's slots over the claims, as in a cluster ----
AGENT_PY=${AGENT_PYTHON:-$PY}     # the share agent's python: this repo's packages' structlog and pyyaml
AGENT_SITE=$REPO/build/gpu-validate-site
AGENT_PATH=
py_imports() {  # MODULES: whether AGENT_PY imports them from this checkout (its error in WORK/import.err)
    (cd "$REPO" && env ${AGENT_PATH:+PYTHONPATH="$AGENT_PATH"} "$AGENT_PY" -c "import $1") 2>"$WORK/import.err"
}
find_python() {  # WHAT MODULES PACKAGE...: AGENT_PY imports MODULES, the PACKAGEs installed into AGENT_SITE if not
    local what=$1 modules=$2; shift 2
    py_imports "$modules" && return 0
    AGENT_PATH=$AGENT_SITE
    [ -d "$AGENT_SITE" ] && py_imports "$modules" && return 0
    echo "gpu-validate: $AGENT_PY cannot import $what ($(tail -1 "$WORK/import.err")): installing" \
         "$* into $AGENT_SITE${AGENT_WHEELS:+ from $AGENT_WHEELS}" >&2
    # shellcheck disable=SC2046  # the options, when AGENT_WHEELS is set
    "$AGENT_PY" -m pip install -q --disable-pip-version-check --target "$AGENT_SITE" \
        $([ -n "${AGENT_WHEELS:-}" ] && echo --no-index --find-links "$AGENT_WHEELS") "$@" >&2 && py_imports "$modules" && return 0
    echo "gpu-validate: $AGENT_PY cannot import $what: $(tail -1 "$WORK/import.err"). Set AGENT_PYTHON" \
         "to a python that can (e.g. $REPO/.venv/bin/python after make -C $REPO .venv/.installed), or carry the" \
         "wheels of $* and set AGENT_WHEELS to their folder" >&2
    return 1
}
find_agent() {
    find_python "the share agent" "dra_driver.cli, dra_driver.log, kubeletplugin.agent.standalone" structlog pyyaml \
        && has_share_agent && return 0
    # `gpushare-dra share-agent` is the node program's, declared in pyproject.toml's entry points,
    # which a checkout never pip-installed lacks (the H200 run of 2026-11-28: "invalid choice:
    # 'share-agent'", every paced case a FAIL): AGENT_SITE gets this checkout's dist-info.
    AGENT_PATH=$AGENT_SITE
    "$AGENT_PY" - "$REPO/pyproject.toml" "$AGENT_SITE" <<'PY' && has_share_agent && return 0
import pathlib, sys, tomllib
project = tomllib.loads(pathlib.Path(sys.argv[1]).read_text())["project"]
info = pathlib.Path(sys.argv[2]) / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
info.mkdir(parents=True, exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
(info / "entry_points.txt").write_text("".join(
    f"[{group}]\n" + "".join(f"{name} = {ref}\n" for name, ref in refs.items())
    for group, refs in project.get("entry-points", {}).items()))
PY
    echo "gpu-validate: $AGENT_PY -m dra_driver.cli has no share-agent command: $(tail -1 "$WORK/import.err")" >&2
    return 1
}
has_share_agent() {
    (cd "$REPO" && env ${AGENT_PATH:+PYTHONPATH="$AGENT_PATH"} "$AGENT_PY" -m dra_driver.cli share-agent --help) \
        >/dev/null 2>"$WORK/import.err"
}
# section 10: the plugin's discovery and publishing, `gpushare-dra discover` (NVML through nvidia-ml-py; the
# kubernetes client, which the slice code's package imports)
find_discover() {
    find_python "gpushare-dra discover" "dra_driver.cli, dra_driver.controller.slices, pynvml" structlog pyyaml \
        kubernetes nvidia-ml-py
}
AGENT=
agent() {  # DIR...: the agent over these claims, once their control files are there; 1 if it did not start
    (cd "$REPO" && exec env ${AGENT_PATH:+PYTHONPATH="$AGENT_PATH"} "$AGENT_PY" -m dra_driver.cli share-agent \
        --interval 0.25 --log-level warning "$@") 2> "$WORK/agent.err" &
    AGENT=$!
    local d all
    for _ in $(seq 100); do
        all=1; for d in "$@"; do [ -e "$d/control/0" ] || all=0; done
        [ "$all" = 1 ] && return 0
        kill -0 "$AGENT" 2>/dev/null || break
        sleep 0.05
    done
    check "$CASE: the share agent" 0 "did not start: $(grep -v '^$' "$WORK/agent.err" | tail -1)"
    agent_stop
    return 1
}
agent_stop() { [ -n "$AGENT" ] && { kill "$AGENT" 2>/dev/null; wait "$AGENT" 2>/dev/null; }; AGENT=; return 0; }

# ---- MPS control daemons (section 6) ----
MPS_DIRS=()  # control daemons started here: told to quit on exit
mps_start() {  # DIR PERCENT: a control daemon (its servers' default active-thread percentage); 1 if none
    mkdir -p "$1/pipe" "$1/log"
    MPS_DIRS+=("$1")
    if [ "$SIM" = 1 ]; then
        "$PY" - "$REPO" "$1/pipe" "$2" <<'PYEOF'
import sys
sys.path.insert(0, sys.argv[1])
from kubeletplugin.hooklayout import SIM_MPS_FILE, sim_mps_server_text
with open(f"{sys.argv[2]}/{SIM_MPS_FILE}", "w") as f:
    f.write(sim_mps_server_text("gpu0", int(sys.argv[3])))
PYEOF
    else
        CUDA_VISIBLE_DEVICES=$GPU CUDA_MPS_PIPE_DIRECTORY=$1/pipe CUDA_MPS_LOG_DIRECTORY=$1/log \
            nvidia-cuda-mps-control -d > "$1/start.err" 2>&1 &&
        echo "set_default_active_thread_percentage $2" | CUDA_MPS_PIPE_DIRECTORY=$1/pipe nvidia-cuda-mps-control > /dev/null 2>> "$1/start.err"
    fi
}
mps_stop() {
    if [ "$SIM" = 1 ]; then rm -f "$1/pipe/"*
    else echo quit | CUDA_MPS_PIPE_DIRECTORY=$1/pipe nvidia-cuda-mps-control > /dev/null 2>&1 || true; fi
}

# shellcheck disable=SC2317  # called by the trap
cleanup() {
    local rc=$? p d
    agent_stop
    for p in $(jobs -p); do pkill -TERM -P "$p" 2>/dev/null; kill "$p" 2>/dev/null; done
    for d in "${MPS_DIRS[@]}"; do mps_stop "$d"; done
    write_json "$rc"
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- set up: the output folder, the build, the GPU (its UUID and SM count), the agent ----
if [ -n "$OUTDIR" ]; then
    mkdir -p "$OUTDIR" || { echo "gpu-validate: cannot make $OUTDIR" >&2; exit 2; }
    OUTDIR=$(cd "$OUTDIR" && pwd)
fi
make -s -j"$(nproc 2>/dev/null || echo 4)" -C "$REPO/hook" >&2 || { echo "gpu-validate: the build failed" >&2; exit 2; }
if [ "$SIM" = 1 ]; then
    export LD_LIBRARY_PATH=$REPO/hook/build/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} GPUSHARE_SIM_STATE=$WORK/sim.state
fi
# The GPU's UUID goes into every claim's limits file (the library refuses a claim without it),
# whichever sections run; nvidia-smi's index order is NVML's, which the probe's `gpus` lists too
UUID=
[ "$SIM" = 0 ] && UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i "$GPU" 2>/dev/null | tr -d ' ')
[[ "$UUID" == GPU-* ]] || UUID=$("$PROBE" gpus 2>/dev/null | sed -n "s/^GPU $GPU: .*(UUID: \(GPU-[^)]*\)).*/\1/p")
[[ "$UUID" == GPU-* ]] || { echo "gpu-validate: no UUID for GPU $GPU (nvidia-smi and the probe's NVML found none)" >&2; exit 2; }
# The SM count from the driver (cuDeviceGetAttribute through the probe: its default grid), never
# from nvidia-smi's text (it has no such field); PyTorch's below, recorded beside it
SMS=$(CUDA_VISIBLE_DEVICES=$GPU "$PROBE" launch --seconds 0.05 --kernel-us 10 2>/dev/null | val grid)
[[ "$SMS" =~ ^[1-9][0-9]*$ ]] || { echo "gpu-validate: the probe cannot run on GPU $GPU (no SM count)" >&2; exit 2; }
MPS_HELD=$("$PY" -c "import sys; sys.path.insert(0, sys.argv[1]); from kubeletplugin.hooklayout import SIM_MPS_HELD as h; print(h)" "$REPO" 2>/dev/null)
num "$MPS_HELD" || MPS_HELD=0.82
NEED_AGENT=0
for s in 4 7 8 9; do want $s && NEED_AGENT=1; done
[ "$NEED_AGENT" = 0 ] || find_agent || exit 2

fact mode "$([ "$SIM" = 1 ] && echo simulated || echo gpu)"
fact date "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
fact host "$(hostname 2>/dev/null || echo unknown)"
fact gpu_index "$GPU"
fact gpu_uuid "$UUID"
fact sm_count "$SMS"
fact git_commit "${GIT_COMMIT:-$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)}"
if git -C "$REPO" rev-parse HEAD > /dev/null 2>&1; then fact git_changed_files "$(git -C "$REPO" status --porcelain | wc -l | tr -d ' ')"; fi
fact sections "$SECTIONS"
fact share_seconds "$W"
fact solo_seconds "$S"
fact start_lead_seconds "$LEAD"
fact budget_seconds "$BUDGET"
fact mps_held "$MPS_HELD"
HAVE_JAX=0 HAVE_TRITON=0
if [ "$SIM" = 1 ]; then
    fact gpu_name "$("$PROBE" gpus 2>/dev/null | sed -n "s/^GPU $GPU: \(.*\) (UUID.*/\1/p")"
    fact driver simulated
else
    IFS=, read -r name driver memory cap <<< "$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader -i "$GPU" 2>/dev/null)"
    fact gpu_name "${name:-unknown}"
    fact driver "${driver# }"
    fact gpu_memory "${memory# }"
    fact compute_capability "${cap# }"
    fact cuda_driver_version "$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | cut -d' ' -f3)"
    if want 2 || want 4 || want 6 || want 8; then
        modules=torch; want 4 && modules=torch,jax,triton
        facts=$(CUDA_VISIBLE_DEVICES=$GPU timeout 120 "$PY" "$WPY" facts "$modules" 2>"$WORK/facts.err")
        if [[ "$facts" == \{* ]]; then
            FACTS+=("\"workload_python\": $facts")
            [[ "$facts" == *'"jax": "'* ]] && HAVE_JAX=1
            [[ "$facts" == *'"triton": "'* ]] && HAVE_TRITON=1
            tsm=$(grep -o '"sm_count": [0-9]*' <<< "$facts" | grep -o '[0-9]*$')
            [ -z "$tsm" ] || [ "$tsm" = "$SMS" ] || echo "gpu-validate: PyTorch says $tsm SMs, the driver $SMS" >&2
        else
            fact workload_python_error "$(tail -1 "$WORK/facts.err")"
        fi
    fi
fi
write_json
echo "gpu-validate: $([ "$SIM" = 1 ] && echo "the simulated GPU" || echo "GPU $GPU") ($UUID, $SMS SMs), sections $SECTIONS," \
     "windows ${W} s (solo ${S} s), budget ${BUDGET} s${OUTDIR:+, figures in $OUTDIR/gpu-validate.json}"

# ---- every PyTorch kind's solo speed, one process (and the torch.profiler captures) ----
declare -A SOLO      # work per second of each kind alone on the GPU, without the library
SOLO_SERVE=          # the serve client's line alone (p50_ms=, p99_ms=)
SOLO_DONE=0
torch_solo() {
    [ "$SOLO_DONE" = 1 ] && return 0
    SOLO_DONE=1
    local kinds="" k line base=$WORK/solo sec=$SECTION
    want 4 && kinds="matmul elementwise graph compile serve" && [ "$HAVE_TRITON" = 1 ] && kinds+=" triton"
    want 6 && kinds+=" matmul infer serve"
    want 8 && kinds+=" train"
    kinds=$(tr ' ' '\n' <<< "$kinds" | awk 'NF && !seen[$0]++' | paste -sd,)
    SECTION=solo CASE="solo speeds"
    mkdir -p "$WORK/prof"
    TMO=400 go "$base" plain "$PY" "$WPY" solo "$kinds" "$S" ${OUTDIR:+--profile-dir "$WORK/prof"}
    for k in ${kinds//,/ }; do
        line=$(grep "^kind=$k " "$base.out" | grep -v 'profile=' | tail -1)
        if [[ "$line" == *" per_s="* ]] && [ "$(val iters <<< "$line")" != 0 ]; then
            SOLO[$k]=$(val per_s <<< "$line")
            [ "$k" = serve ] && SOLO_SERVE=$line
            check "solo $k (recorded)" 1 "${SOLO[$k]} per s$([ "$k" = serve ] && echo ", p50/p99 $(val p50_ms <<< "$line")/$(val p99_ms <<< "$line") ms")" \
                recorded per_s="${SOLO[$k]}" iters="$(val iters <<< "$line")" p50_ms="$(val p50_ms <<< "$line")" p99_ms="$(val p99_ms <<< "$line")"
        else
            check "solo $k" 0 "no figure: $(if [ -n "$line" ]; then val error <<< "$line"; else why "$base"; fi)"
        fi
    done
    if want 4 && [ "$HAVE_JAX" = 1 ]; then
        go "$WORK/solo-jax" plain "$PY" "$WPY" solo jax "$S"
        line=$(grep '^kind=jax ' "$WORK/solo-jax.out" | tail -1)
        if [[ "$line" == *" per_s="* ]]; then SOLO[jax]=$(val per_s <<< "$line"); check "solo jax (recorded)" 1 "${SOLO[jax]} per s" recorded per_s="${SOLO[jax]}"
        else check "solo jax" 0 "no figure: $(why "$WORK/solo-jax")"; fi
    fi
    [ -n "$OUTDIR" ] && captures "$base"
    SECTION=$sec
}
captures() {  # BASE: the solo run's torch.profiler captures into OUTDIR/profiled-NAME.trace, each replayed once
    SECTION=capture
    local k name tr stats line r
    for k in train elementwise serve; do
        case $k in train) name=train-transformer ;; serve) name=serve-mlp ;; *) name=$k ;; esac
        CASE="capture $name"
        [ -n "${SOLO[$k]:-}" ] || continue
        if [ ! -s "$WORK/prof/$k.json" ]; then
            check "$name: torch.profiler capture" 0 "no profile: $(grep "^kind=$k error=" "$1.out" | val error)"; continue
        fi
        tr=$OUTDIR/profiled-$name.trace
        if ! stats=$("$PY" "$REPO/hack/trace-from-profile.py" "$WORK/prof/$k.json" -o "$tr" --sms "$SMS" \
                --title "$name, hack/gpu-validate-work.py $k on $(nvidia-smi --query-gpu=name --format=csv,noheader -i "$GPU" 2>/dev/null | head -1)" 2>&1); then
            check "$name: profile to trace" 0 "$(tail -1 <<< "$stats")"; continue
        fi
        go "$WORK/replay-$k" plain "$PROBE" replay --trace "$tr" --seconds "$PS"
        line=$(cat "$WORK/replay-$k.out")
        r=$(sps_of "$WORK/replay-$k")
        check "$name: captured trace (recorded)" "$([ -n "$r" ] && echo 1 || echo 0)" \
            "$(val kernels <<< "$stats") GPU ops, $(val gpu_ms <<< "$stats") ms GPU in a $(val step_ms <<< "$stats") ms step ($(val busy_share <<< "$stats") % busy); replayed by the probe: ${r:-$(why "$WORK/replay-$k")} steps/s, $(val gpu_share <<< "$line") % busy, p50 $(val step_p50_ms <<< "$line") ms" \
            recorded trace="$(basename "$tr")" kernels="$(val kernels <<< "$stats")" gpu_ms="$(val gpu_ms <<< "$stats")" \
            step_ms="$(val step_ms <<< "$stats")" busy_share="$(val busy_share <<< "$stats")" kinds="$(val kinds <<< "$stats")" \
            replay_steps_per_s="$r" replay_gpu_share="$(val gpu_share <<< "$line")" replay_p50_ms="$(val step_p50_ms <<< "$line")" \
            torch_steps_per_s="$([ "$k" = elementwise ] && awk -v r="${SOLO[$k]}" 'BEGIN { printf "%.3f", r / 500 }' || echo "${SOLO[$k]}")"
    done
    (cd "$WORK/prof" && ls ./*.json > /dev/null 2>&1 && tar czf "$OUTDIR/profiles.tar.gz" ./*.json)
}

# share_rows A A-PCT A-NOTE B B-PCT B-NOTE [PLAIN-SUM]: the claims at shares A and B ran at A-PCT
# and B-PCT % of their solo speed: each >= its share - 3, together >= 0.95 x the plain pair (the
# same processes without the library)
# share_rows A GA NOTE_A B GB NOTE_B PLAIN [BUSY PA PB]: each Hard claim >= its share - 3 % of
# solo, together >= 0.95 x the plain pair; with BUSY (the step's % of the GPU alone) and the plain
# pair's parts PA and PB, each part capped at what its limit allows (limit / BUSY of solo: Hard
# 30 of a 40 %-busy step is 75 % of solo, however much plain time slicing gives it)
share_rows() {
    local a=$1 ga=$2 na=$3 b=$4 gb=$5 nb=$6 plain=${7:-} busy=${8:-} t target what=">= 0.95 x the plain pair"
    check "claim $a >= its share - 3" "$(atleast "$ga" $((a - 3)))" "$(sol "$ga" "see above"); $na" ">= $((a - 3)) % of solo" pct_of_solo="$ga"
    check "claim $b >= its share - 3" "$(atleast "$gb" $((b - 3)))" "$(sol "$gb" "see above"); $nb" ">= $((b - 3)) % of solo" pct_of_solo="$gb"
    t=$(sum "$ga" "$gb")
    target=$(times "${plain:-0}" 0.95)
    if num "$busy" && num "${9:-}" && num "${10:-}"; then
        target=$(awk -v busy="$busy" -v a="$a" -v b="$b" -v pa="$9" -v pb="${10}" 'BEGIN {
            ca = 100 * a / busy; cb = 100 * b / busy
            printf "%.1f", 0.95 * ((pa < ca ? pa : ca) + (pb < cb ? pb : cb)) }')
        what=">= 0.95 x the plain pair, each part at most its limit / $busy % busy"
    fi
    check "together >= 0.95 x plain time slicing" "$(atleast "$t" "$target")" \
        "together ${t:-?}%, plain pair ${plain:-?}% of solo, target $target" "$what" together="$t" plain_pair="$plain" target="$target"
}

# ---- section 10: MIG, read only: what the plugin publishes for the GPU and why ----
in_repo() { (cd "$REPO" && exec "$@"); }
discover() {  # BASE MIG_GPUS [VAR=VALUE...]: `gpushare-dra discover` (NVML, read only) as a plugin with --mig-gpus MIG_GPUS
    local base=$1 gpus=$2; shift 2
    go "$base" in_repo timeout -k 5 120 env ${AGENT_PATH:+PYTHONPATH="$AGENT_PATH"} "$@" "$AGENT_PY" -m dra_driver.cli \
        discover --device-backend nvml --sharing-mode capacity --mig-gpus "$gpus" --log-level warning
}
mig_rows() {  # NONE NAMED: the rows of discover's two answers, --mig-gpus none and --mig-gpus GPU
    local facts mode same nd nm nn profiles note
    if ! facts=$(in_repo env ${AGENT_PATH:+PYTHONPATH="$AGENT_PATH"} "$AGENT_PY" - "$1.out" "$2.out" "$GPU" 2>"$WORK/mig.err" <<'PYEOF'
import sys

import yaml

none, named = (yaml.safe_load(open(path)) or {} for path in sys.argv[1:3])
gpu = int(sys.argv[3])
info = next(g for g in named["gpus"] if g["index"] == gpu)


def of_gpu(doc):
    return [d for d in doc["devices"]["capacity"] if d["name"] == f"gpu-{gpu}" or d["name"].startswith(f"gpu-{gpu}-")]


mig = [d["name"] for d in of_gpu(named) if d["name"].startswith(f"gpu-{gpu}-mig-")]
profiles = sorted({name.split("-mig-")[1].rsplit("-", 1)[0] for name in mig})  # as device names spell them
notes = [n for n in (named.get("mig") or {}).get("notes", []) if n.startswith(f"GPU {gpu} ")]
print(f"mode={int(bool(info.get('migMode')))} same={int(of_gpu(none) == of_gpu(named))} all={len(of_gpu(named))} "
      f"mig={len(mig)} unnamed={len(of_gpu(none))} profiles={','.join(profiles) or '-'}")
print("note=" + (notes[0] if notes else "").replace("\n", " "))
PYEOF
    ); then
        check "discover's answers read" 0 "$(tail -1 "$WORK/mig.err")"
        return
    fi
    mode=$(val mode <<< "$facts"); same=$(val same <<< "$facts"); nd=$(val all <<< "$facts")
    nm=$(val mig <<< "$facts"); nn=$(val unnamed <<< "$facts"); profiles=$(val profiles <<< "$facts")
    note=$(sed -n 's/^note=//p' <<< "$facts")
    if [ "$mode" = 0 ]; then
        check "MIG mode off, named by --mig-gpus: published as before" "$([ "$same" = 1 ] && [ "$nd" -gt 0 ] && echo 1 || echo 0)" \
            "$nd device(s) of GPU $GPU, $([ "$same" = 1 ] && echo "the same as" || echo "NOT those") without --mig-gpus" \
            "the devices published without --mig-gpus" same="$same" devices="$nd"
        check "MIG mode off: says why it offers no MIG devices" \
            "$([[ "$note" == *"MIG mode is disabled: no MIG devices"* ]] && [ "$nm" = 0 ] && echo 1 || echo 0)" \
            "${note:-no note}" "the plugin's note: MIG mode disabled" mig_devices="$nm"
    else
        check "MIG mode on, named: its profile placements published as MIG devices" \
            "$([ "$nm" -gt 0 ] && [ "$nm" = "$nd" ] && echo 1 || echo 0)" "$nm of $nd device(s) of GPU $GPU ($profiles)" \
            "> 0, and nothing of the GPU whole" mig_devices="$nm" devices="$nd" profiles="$profiles"
        check "MIG mode on, not named: not offered" "$([ "$nn" = 0 ] && echo 1 || echo 0)" "$nn device(s)" 0 devices="$nn"
        check "MIG mode on: the plugin's note (recorded)" 1 "${note:-no note}" recorded
    fi
}
mig_mode_smi() { nvidia-smi --query-gpu=mig.mode.current,mig.mode.pending --format=csv,noheader -i "$GPU" 2>/dev/null | tr -d ' '; }

if section 10 "MIG, read only (the GPU's MIG mode and instances are never changed)"; then
CASE="MIG read only"
if [ "$SIM" = 0 ]; then  # [N/A]: a GPU without MIG; Enabled/Disabled: one with it (the pending mode after a reset)
    before=$(mig_mode_smi)
    check "MIG mode current,pending (nvidia-smi, recorded)" 1 "${before:-nvidia-smi answered nothing}" recorded \
        current="${before%%,*}" pending="${before#*,}"
fi
if ! find_discover; then
    check "gpushare-dra discover runs (the plugin's discovery and publishing)" 0 "$(tail -1 "$WORK/import.err")"
elif ! discover "$WORK/mig-none" none || ! discover "$WORK/mig-named" "$GPU"; then
    check "gpushare-dra discover runs (the plugin's discovery and publishing)" 0 \
        "$(why "$WORK/mig-none"); $(why "$WORK/mig-named")"
else
    mig_rows "$WORK/mig-none" "$WORK/mig-named"
    if [ "$SIM" = 1 ]; then  # the other state, on a simulated GPU in MIG mode (its own state file)
        CASE="MIG read only, a simulated GPU in MIG mode"
        sim_mig=(GPUSHARE_SIM_MIG="$GPU" GPUSHARE_SIM_STATE="$WORK/mig-sim.state")
        if discover "$WORK/mig-on-none" none "${sim_mig[@]}" && discover "$WORK/mig-on-named" "$GPU" "${sim_mig[@]}"; then
            mig_rows "$WORK/mig-on-none" "$WORK/mig-on-named"
        else
            check "gpushare-dra discover runs" 0 "$(why "$WORK/mig-on-none"); $(why "$WORK/mig-on-named")"
        fi
    fi
fi
if [ "$SIM" = 0 ]; then
    after=$(mig_mode_smi)
    check "MIG mode unchanged" "$([ "$after" = "$before" ] && echo 1 || echo 0)" "before $before, after $after" "unchanged"
fi
fi  # section 10

if section 1 "the probe: memory"; then
CASE="probe memory"
claim "$WORK/a" 100
allocated=$(under "$WORK/a" "$PROBE" alloc --chunk 256Mi | val allocated)
check "probe: OOM exactly at the limit" "$([ "$allocated" = "$LIMIT" ] && echo 1 || echo 0)" "allocated=$allocated" \
    "$LIMIT" allocated="$allocated"
info=$(under "$WORK/a" "$PROBE" meminfo)
cu_total=$(val cu_total <<< "$info"); nvml_total=$(val nvml_total <<< "$info")
check "probe: cuMemGetInfo and NVML report the limit" \
    "$([ "$cu_total" = "$LIMIT" ] && [ "$nvml_total" = "$LIMIT" ] && echo 1 || echo 0)" \
    "cu_total=$cu_total nvml_total=$nvml_total" "$LIMIT" cu_total="$cu_total" nvml_total="$nvml_total"
fi

if section 2 "PyTorch: memory"; then
CASE="torch memory"
claim "$WORK/a" 100
go "$WORK/oom" under "$WORK/a" "$PY" "$WPY" oom
total=$(val total < "$WORK/oom.out"); oom=$(val oom < "$WORK/oom.out"); held=$(val held < "$WORK/oom.out")
check "torch: mem_get_info total == limit" "$([ "$total" = "$LIMIT" ] && echo 1 || echo 0)" "total=${total:-$(why "$WORK/oom")}" \
    "$LIMIT" total="$total"
check "torch: OutOfMemoryError at the limit" "$([ "$oom" = 1 ] && [ "${held:-0}" -le "$LIMIT" ] && echo 1 || echo 0)" \
    "held=${held:-$(why "$WORK/oom")}" "OOM with at most $LIMIT held" held="$held"
fi

if section 3 "two processes, one region"; then
CASE="two processes share one budget"
claim "$WORK/a" 100
under "$WORK/a" "$PROBE" alloc --chunk 256Mi --max 1Gi --hold 20 > "$WORK/holder.out" 2>&1 &
holder=$!
for _ in $(seq 100); do grep -q '^allocated=' "$WORK/holder.out" && break; sleep 0.1; done
second=$(under "$WORK/a" "$PROBE" alloc --chunk 256Mi | val allocated)
pkill -TERM -P $holder 2>/dev/null; kill $holder 2>/dev/null; wait $holder 2>/dev/null
check "two processes share one budget" "$([ "$second" = $((LIMIT - 1024 * 1024 * 1024)) ] && echo 1 || echo 0)" \
    "second process got ${second:-nothing}" "$((LIMIT - 1024 * 1024 * 1024))" second="$second"
fi

if section 4 "compute shares, PyTorch, with the share agent"; then
torch_solo
# pair KIND30 KIND70: Hard claims at 30 and 70, each claim's speed as a share of its solo speed
pair() {
    begin_case "30/70 $1 vs $2" || return 0
    local d="$WORK/pair-$1-$2" at ra rb sa sb
    claim "$d/a" 30; claim "$d/b" 70
    agent "$d/a" "$d/b" || return 0
    at=$(at_in "$LEAD")
    go "$d/a" under "$d/a" "$PY" "$WPY" "$1" "$W" --at "$at" & local pa=$!
    go "$d/b" under "$d/b" "$PY" "$WPY" "$2" "$W" --at "$at"; wait $pa
    agent_stop
    ra=$(rate_of "$d/a"); rb=$(rate_of "$d/b")
    sa=$(pct "$ra" "${SOLO[$1]:-}"); sb=$(pct "$rb" "${SOLO[$2]:-}")
    check "30/70 $1 vs $2: claim 30 within 3 points" "$(within "$sa" 30 3)" \
        "$([ -n "$sa" ] && echo "claim 30 at ${sa}% of solo$(late_of "$d/a")" || echo "no figure: $(why "$d/a")")" \
        "30 +- 3 % of solo" pct_of_solo="$sa" per_s="$ra" solo_per_s="${SOLO[$1]:-}"
    check "30/70 $1 vs $2: claim 70 within 3 points" "$(within "$sb" 70 3)" \
        "$([ -n "$sb" ] && echo "claim 70 at ${sb}% of solo$(late_of "$d/b")" || echo "no figure: $(why "$d/b")")" \
        "70 +- 3 % of solo" pct_of_solo="$sb" per_s="$rb" solo_per_s="${SOLO[$2]:-}"
    check "30/70 $1 vs $2: together >= 90% of solo" "$(atleast "$(sum "$sa" "$sb")" 90)" "together $(sum "$sa" "$sb")%" \
        ">= 90 % of solo" together="$(sum "$sa" "$sb")"
}
pair matmul matmul
pair elementwise elementwise
pair matmul elementwise

# alone KINDS LIMIT [POLICY]: one claim alone, its process running each kind in turn
# (gpu-validate-work.py solo: one start for all, as for the solo figures); each kind's speed as a
# share of solo
alone() {
    local kinds=$1 limit=$2 policy=${3:-Hard} d="$WORK/alone-${1//,/-}-$2-${3:-Hard}" k got line
    begin_case "${kinds//,/, } alone at $limit $policy" || return 0
    claim "$d" "$limit" "$policy"
    agent "$d" || return 0
    go "$d" under "$d" "$PY" "$WPY" solo "$kinds" "$W"
    agent_stop
    for k in ${kinds//,/ }; do
        line=$(grep "^kind=$k " "$d.out" 2>/dev/null | tail -1)
        got=$(pct "$(val per_s <<< "$line")" "${SOLO[$k]:-}")
        local err=${line:+$(val error <<< "$line")}
        if [ "$policy" = Burst ]; then
            check "Burst $limit alone ($k) >= 90% of solo" "$(atleast "$got" 90)" "$(sol "$got" "${err:-$(why "$d")}")" \
                ">= 90 % of solo" pct_of_solo="$got"
        else
            check "$k alone at $limit within 3 points" "$(within "$got" "$limit" 3)" "$(sol "$got" "${err:-$(why "$d")}")" \
                "$limit +- 3 % of solo" pct_of_solo="$got"
        fi
    done
}
kinds=graph,compile; [ "$HAVE_TRITON" = 1 ] && kinds+=,triton
alone "$kinds" 50
if [ "$HAVE_JAX" = 1 ]; then alone jax 50; else CASE="jax alone at 50"; check "jax alone at 50" skip "jax not installed"; fi
[ "$HAVE_TRITON" = 1 ] || { CASE="triton alone at 50"; check "triton alone at 50" skip "triton not installed"; }
alone matmul 30 Burst

# latency of an inference-like client at 50 beside a busy matmul neighbour at 50
if begin_case "inference client beside a busy matmul"; then
    claim "$WORK/lc" 50; claim "$WORK/ln" 50
    at=$(at_in "$LEAD")
    go "$WORK/lat-nb" plain "$PY" "$WPY" matmul $((W + 1)) --at "$at" & nb=$!
    go "$WORK/lat-plain" plain "$PY" "$WPY" serve "$W" --at "$at"; wait $nb
    if agent "$WORK/lc" "$WORK/ln"; then
        at=$(at_in "$LEAD")
        go "$WORK/lat-lnb" under "$WORK/ln" "$PY" "$WPY" matmul $((W + 1)) --at "$at" & nb=$!
        go "$WORK/lat-lib" under "$WORK/lc" "$PY" "$WPY" serve "$W" --at "$at"; wait $nb
        agent_stop
    fi
    p50s=$(val p50_ms <<< "$SOLO_SERVE"); p99s=$(val p99_ms <<< "$SOLO_SERVE")
    p50l=$(val p50_ms < "$WORK/lat-lib.out" 2>/dev/null); p99l=$(val p99_ms < "$WORK/lat-lib.out" 2>/dev/null)
    p99p=$(val p99_ms < "$WORK/lat-plain.out" 2>/dev/null)
    check "client under its share: p50 within 1.2x solo" "$(atmost "$p50l" "$(times "${p50s:-0}" 1.2)")" \
        "p50 solo ${p50s:-?}, library ${p50l:-$(why "$WORK/lat-lib")} ms" "<= 1.2 x solo p50" p50_solo="$p50s" p50_library="$p50l"
    check "client p99 no worse than plain time-slicing" "$(atmost "$p99l" "$p99p")" \
        "p99 solo ${p99s:-?}, time-slicing ${p99p:-$(why "$WORK/lat-plain")}, library ${p99l:-?} ms" "<= the plain p99" \
        p99_solo="$p99s" p99_plain="$p99p" p99_library="$p99l" p50_plain="$(val p50_ms < "$WORK/lat-plain.out" 2>/dev/null)"
fi
fi  # section 4

if section 5 "launch overhead"; then
CASE="launch overhead"
claim "$WORK/a" 100
lplain=$(CUDA_VISIBLE_DEVICES=$GPU "$PROBE" launch --seconds "$PS" --kernel-us 1 | val launches_per_s)
hooked=$(under "$WORK/a" "$PROBE" launch --seconds "$PS" --kernel-us 1 | val launches_per_s)
claim "$WORK/c50" 50
paced=$(under "$WORK/c50" "$PROBE" launch --seconds "$PS" --kernel-us 200 --warmup 0.5 | val busy_share)
check "launch rate, 1 us kernels: without / with library (recorded)" 1 "${lplain:-?} / ${hooked:-?} launches/s (H100 2026-11-28: 270,663 / 244,770)" \
    recorded plain_per_s="$lplain" library_per_s="$hooked"
check "probe busy share at compute limit 50" "$(within "$paced" 50 5)" "busy_share=${paced:-?}" "50 +- 5" busy_share="$paced"
fi

# The probe's solo rates, shared by sections 7 and 9: launches per second of KERNEL_US kernels
# alone, no library. Kernels of a millisecond or more go in 200 ms bursts, each waited for: flat
# out, the driver queues about 1,024 kernels, which take seconds to drain after the window (12 s
# of 12 ms kernels; the same rate: the GPU idles only for the sync between bursts). The better of
# two windows of PS/2: a figure something else on the GPU slowed once (seen on a loaded
# simulator) does not become every claim's denominator
declare -A P7SOLO
p7() { CUDA_VISIBLE_DEVICES=$GPU timeout -k 5 "$TMO" "$PROBE" "$@"; }
p7solo() {
    if [ -z "${P7SOLO[$1]:-}" ]; then
        local r1 r2
        # shellcheck disable=SC2046  # the burst options
        r1=$(p7 launch --seconds "$(awk -v s="$PS" 'BEGIN { print s / 2 }')" --kernel-us "$1" $([ "$1" -ge 1000 ] && echo --on-ms 200 --off-ms 0) | val launches_per_s)
        # shellcheck disable=SC2046
        r2=$(p7 launch --seconds "$(awk -v s="$PS" 'BEGIN { print s / 2 }')" --kernel-us "$1" $([ "$1" -ge 1000 ] && echo --on-ms 200 --off-ms 0) | val launches_per_s)
        P7SOLO[$1]=$(num "$r1" && num "$r2" && awk -v a="$r1" -v b="$r2" 'BEGIN { print (a > b) ? a : b }' || echo "${r1:-$r2}")
    fi
    echo "${P7SOLO[$1]}"
}

if section 8 "a transformer training pair, PyTorch"; then
torch_solo
if begin_case "transformer training 30/70"; then
    d="$WORK/train"; solo=${SOLO[train]:-}
    if [ -z "$solo" ]; then
        check "transformer training: solo" 0 "no solo figure (see the solo rows)"
    else
        at=$(at_in $((LEAD + 3)))
        go "$d-pa" plain "$PY" "$WPY" train "$W" --at "$at" & pa=$!
        go "$d-pb" plain "$PY" "$WPY" train "$W" --at "$at"; wait $pa
        pa_pct=$(pct "$(rate_of "$d-pa")" "$solo"); pb_pct=$(pct "$(rate_of "$d-pb")" "$solo")
        plain_sum=$(sum "$pa_pct" "$pb_pct")
        check "plain time slicing: two processes, no library (recorded)" "$([ -n "$plain_sum" ] && echo 1 || echo 0)" \
            "${pa_pct:-no figure: $(why "$d-pa")}% + ${pb_pct:-$(why "$d-pb")}% = ${plain_sum:-?}% of solo (${solo} steps/s)$(late_of "$d-pa")$(late_of "$d-pb")" \
            recorded a_pct="$pa_pct" b_pct="$pb_pct" together="$plain_sum" solo_steps_per_s="$solo"
        claim "$d/a" 30 Hard "$TRAIN_LIMIT"; claim "$d/b" 70 Hard "$TRAIN_LIMIT"
        if agent "$d/a" "$d/b"; then
            at=$(at_in $((LEAD + 3)))
            go "$d/a" under "$d/a" "$PY" "$WPY" train "$W" --at "$at" & pa=$!
            go "$d/b" under "$d/b" "$PY" "$WPY" train "$W" --at "$at"; wait $pa
            agent_stop
            sa=$(pct "$(rate_of "$d/a")" "$solo"); sb=$(pct "$(rate_of "$d/b")" "$solo")
            [ -n "$sa" ] || check "claim 30: the run" 0 "$(why "$d/a")"
            [ -n "$sb" ] || check "claim 70: the run" 0 "$(why "$d/b")"
            share_rows 30 "$sa" "training steps/s$(late_of "$d/a")" 70 "$sb" "training steps/s$(late_of "$d/b")" "$plain_sum"
        fi
    fi
fi
fi  # section 8

if section 9 "framework-shaped traces replayed by the probe (hook/traces)"; then
TRACES=$REPO/hook/traces
declare -A RSOLO
CASE="replay solo"
for t in train-transformer train-transformer-h200 elementwise serve-mlp; do
    go "$WORK/rsolo-$t" plain "$PROBE" replay --trace "$TRACES/$t.trace" --seconds "$S"
    RSOLO[$t]=$(sps_of "$WORK/rsolo-$t")
    check "$t.trace alone, no library (recorded)" "$([ -n "${RSOLO[$t]}" ] && echo 1 || echo 0)" \
        "${RSOLO[$t]:-no figure: $(why "$WORK/rsolo-$t")} steps/s, $(val gpu_share < "$WORK/rsolo-$t.out") % busy, p50/p99 $(val step_p50_ms < "$WORK/rsolo-$t.out")/$(val step_p99_ms < "$WORK/rsolo-$t.out") ms" \
        recorded steps_per_s="${RSOLO[$t]}" gpu_share="$(val gpu_share < "$WORK/rsolo-$t.out")" \
        p50_ms="$(val step_p50_ms < "$WORK/rsolo-$t.out")" p99_ms="$(val step_p99_ms < "$WORK/rsolo-$t.out")"
done
p7solo 2650 > /dev/null; L2650=${P7SOLO[2650]}
# rpair NAME LIMIT_A A... -- LIMIT_B B...: A and B (probe arguments after the probe: a replay or
# a launch) side by side, first without the library (BASE-p{a,b}), then as Hard claims at
# LIMIT_A and LIMIT_B with the agent (BASE/{a,b}); 1 if the agent did not start
rpair() {
    local base=$1 la=$2 lb args_a=() args_b=(); shift 2
    while [ "$1" != -- ]; do args_a+=("$1"); shift; done; shift
    lb=$1; shift; args_b=("$@")
    go "$base-pa" plain "$PROBE" "${args_a[@]}" --warmup 0.5 & local pa=$!
    go "$base-pb" plain "$PROBE" "${args_b[@]}" --warmup 0.5; wait $pa
    claim "$base/a" "$la"; claim "$base/b" "$lb"
    agent "$base/a" "$base/b" || return 1
    go "$base/a" under "$base/a" "$PROBE" "${args_a[@]}" --warmup 0.5 & pa=$!
    go "$base/b" under "$base/b" "$PROBE" "${args_b[@]}" --warmup 0.5; wait $pa
    agent_stop
}
# the training traces at 30/70: the repository's (67 % busy on the H200) and the H200's own
# capture of hack/gpu-validate-work.py train (40 %; its pair lost a third of plain, 2026-11-28)
for t in train-transformer train-transformer-h200; do
if begin_case "$t.trace 30/70"; then
    rb="$WORK/rt-$t"
    if rpair "$rb" 30 replay --trace "$TRACES/$t.trace" --seconds "$W" -- 70 replay --trace "$TRACES/$t.trace" --seconds "$W"; then
        s=${RSOLO[$t]}
        pa_pct=$(pct "$(sps_of "$rb-pa")" "$s"); pb_pct=$(pct "$(sps_of "$rb-pb")" "$s"); plain_sum=$(sum "$pa_pct" "$pb_pct")
        check "plain time slicing, no library (recorded)" "$([ -n "$plain_sum" ] && echo 1 || echo 0)" \
            "${pa_pct:-no figure: $(why "$rb-pa")}% + ${pb_pct:-$(why "$rb-pb")}% = ${plain_sum:-?}% of solo" recorded a_pct="$pa_pct" b_pct="$pb_pct" together="$plain_sum"
        sa=$(pct "$(sps_of "$rb/a")" "$s"); sb=$(pct "$(sps_of "$rb/b")" "$s")
        share_rows 30 "$sa" "steps/s; $(val gpu_share < "$rb/a.out") % of the GPU" 70 "$sb" "steps/s; $(val gpu_share < "$rb/b.out") % of the GPU" "$plain_sum" \
            "$(val gpu_share < "$WORK/rsolo-$t.out")" "$pa_pct" "$pb_pct"
    fi
fi
done
if begin_case "elementwise.trace at 70 beside a 2.65 ms launch claim at 30"; then
    rb="$WORK/re"
    if rpair "$rb" 70 replay --trace "$TRACES/elementwise.trace" --seconds "$W" -- 30 launch --kernel-us 2650 --seconds "$W"; then
        s=${RSOLO[elementwise]}
        pa_pct=$(pct "$(sps_of "$rb-pa")" "$s"); pb_pct=$(pct "$(lps_of "$rb-pb")" "$L2650"); plain_sum=$(sum "$pa_pct" "$pb_pct")
        check "plain time slicing, no library (recorded)" "$([ -n "$plain_sum" ] && echo 1 || echo 0)" \
            "elementwise ${pa_pct:-no figure: $(why "$rb-pa")}% + launch ${pb_pct:-$(why "$rb-pb")}% = ${plain_sum:-?}% of solo" recorded a_pct="$pa_pct" b_pct="$pb_pct" together="$plain_sum"
        sa=$(pct "$(sps_of "$rb/a")" "$s"); sb=$(pct "$(lps_of "$rb/b")" "$L2650")
        [ -n "$sa" ] || check "elementwise claim: the run" 0 "$(why "$rb/a")"
        [ -n "$sb" ] || check "launch claim: the run" 0 "$(why "$rb/b")"
        share_rows 70 "$sa" "elementwise.trace steps/s; $(val gpu_share < "$rb/a.out") % of the GPU" 30 "$sb" "2.65 ms kernels/s" "$plain_sum"
    fi
fi
if begin_case "serve-mlp.trace at 50 beside a busy 2.65 ms launch claim at 50"; then
    rb="$WORK/rs"
    if rpair "$rb" 50 replay --trace "$TRACES/serve-mlp.trace" --seconds "$W" -- 50 launch --kernel-us 2650 --seconds $((W + 1)); then
        p50s=$(val step_p50_ms < "$WORK/rsolo-serve-mlp.out"); p99s=$(val step_p99_ms < "$WORK/rsolo-serve-mlp.out")
        p50p=$(val step_p50_ms < "$rb-pa.out"); p99p=$(val step_p99_ms < "$rb-pa.out")
        p50l=$(val step_p50_ms < "$rb/a.out"); p99l=$(val step_p99_ms < "$rb/a.out")
        nb=$(pct "$(lps_of "$rb/b")" "$L2650")
        check "client p50 within 1.2x solo" "$(atmost "$p50l" "$(times "${p50s:-0}" 1.2)")" \
            "p50 solo ${p50s:-?}, time slicing ${p50p:-?}, library ${p50l:-$(why "$rb/a")} ms" "<= 1.2 x solo p50" \
            p50_solo="$p50s" p50_plain="$p50p" p50_library="$p50l"
        check "client p99 no worse than plain time slicing" "$(atmost "$p99l" "$p99p")" \
            "p99 solo ${p99s:-?}, time slicing ${p99p:-$(why "$rb-pa")}, library ${p99l:-?} ms" "<= the plain p99" \
            p99_solo="$p99s" p99_plain="$p99p" p99_library="$p99l"
        check "the busy claim at 50 >= its share - 3" "$(atleast "$nb" 47)" "$(sol "$nb" "$(why "$rb/b")")" ">= 47 % of solo" pct_of_solo="$nb"
    fi
fi
fi  # section 9

if section 6 "MPS"; then
[ "$SIM" = 1 ] || torch_solo
# A control daemon with its own pipe directory whose servers give clients at most the default
# active-thread percentage; a client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE may only lower it
# (NVIDIA's MPS documentation). With --sim: the simulated server (hook/sim/sim_mps.h: the file the
# trusted side writes in the pipe directory) and the probe's spin kernels instead of PyTorch:
# matmul = 0.5 ms kernels on every SM (short: what a client has queued drains soon at 10 %),
# infer = 0.41 ms kernels on a quarter of them, serve = the probe's inference-like client on a
# quarter of them.
# mps_run BASE DIR PERCENT|- KIND SECONDS [CLAIM]: one client (DIR "": no MPS) lowering its
# server's percentage to PERCENT; prints its rate (work per second; serve: the latency line), or
# nothing (why BASE says why). CLAIM: a claim dir whose library is preloaded. AT (env): the
# window's start, for two clients measured together (PyTorch only)
mps_run() {
    local base=$1 dir=$2 pct=$3 kind=$4 secs=$5 under_claim=${6:-}
    local env=(CUDA_VISIBLE_DEVICES="$GPU")
    [ -n "$dir" ] && env+=(CUDA_MPS_PIPE_DIRECTORY="$dir/pipe")
    [ "$pct" != - ] && env+=(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="$pct")
    [ -n "${CUDA_MPS_CLIENT_PRIORITY:-}" ] && env+=(CUDA_MPS_CLIENT_PRIORITY="$CUDA_MPS_CLIENT_PRIORITY")
    [ -n "$under_claim" ] && env+=(GPUSHARE_RUN_DIR="$under_claim" LD_PRELOAD="$LIB")
    if [ "$SIM" = 0 ]; then
        go "$base" timeout -k 5 "$TMO" env "${env[@]}" "$PY" "$WPY" "$kind" "$secs" ${AT:+--at "$AT"}
        if [ "$kind" = serve ]; then grep -s 'p99_ms=' "$base.out"; else rate_of "$base"; fi
        return 0
    fi
    case $kind in
        # a whole-GPU grid: an MPS client's default grid is its share's SMs (issue 27)
        matmul) go "$base" timeout -k 5 "$TMO" env "${env[@]}" "$PROBE" launch --seconds "$secs" --kernel-us 500 --grid "$SMS" ;;
        infer) go "$base" timeout -k 5 "$TMO" env "${env[@]}" "$PROBE" launch --seconds "$secs" --kernel-us 410 --grid $((SMS / 4)) ;;
        serve) go "$base" timeout -k 5 "$TMO" env "${env[@]}" "$PROBE" serve --seconds "$secs" --grid $((SMS / 4))
               grep -s 'p99_ms=' "$base.out"; return 0 ;;
    esac
    local d w; d=$(val done_in_window < "$base.out"); w=$(val window_s < "$base.out")
    num "$d" && num "$w" && [ "$d" != 0 ] && awk -v d="$d" -v w="$w" 'BEGIN { printf "%.3f", d / w }'
    return 0
}
mps_case() {  # NAME DIR PERCENT: begin a case with a daemon; 1 (and a FAIL row) if it did not start
    begin_case "$1" || return 1
    mps_start "$2" "$3" && return 0
    check "$1: the MPS control daemon" 0 "did not start: $(tail -1 "$2/start.err" 2>/dev/null)"
    return 1
}
mps_pct() { pct "$1" "${SOLO[matmul]:-}"; }
AT=             # the common window's start of two PyTorch clients (mps_run reads it)
# mps_pair DIR KIND PCT_A PCT_B: two clients of the case's daemon at once, over one window; their
# rates in DIR/a.rate and DIR/b.rate; then the daemon stops
mps_pair() {
    AT=$([ "$SIM" = 0 ] && at_in "$LEAD")
    mps_run "$1/a" "$1" "$3" "$2" "$W" > "$1/a.rate" & local pa=$!
    mps_run "$1/b" "$1" "$4" "$2" "$W" > "$1/b.rate"; wait $pa; AT=
    mps_stop "$1"
}
if [ "$SIM" = 1 ]; then  # solo: alone on the GPU, no MPS
    for kind in matmul infer; do SOLO[$kind]=$(mps_run "$WORK/mps-solo-$kind" "" - "$kind" "$S"); done
fi
d="$WORK/mps-pair-matmul"
if mps_case "MPS 30/70 matmul clients" "$d" 100; then
    mps_pair "$d" matmul 30 70
    ra=$(cat "$d/a.rate"); rb=$(cat "$d/b.rate")
    s30=$(pct "$ra" "$(sum "$ra" "$rb")")
    check "MPS 30/70 matmul: client 30 within 3 points" "$(within "$s30" 30 3)" \
        "$([ -n "$s30" ] && echo "client 30 did ${s30}% of the pair's work (H100: 30.1, 29.5)" || echo "no figure: $(why "$d/a"); $(why "$d/b")")" \
        "30 +- 3 % of the pair's work" part_pct="$s30" rate_30="$ra" rate_70="$rb"
    check "MPS 30/70 matmul: the pair's work vs solo (recorded)" 1 "$(mps_pct "$(sum "$ra" "$rb")")% of solo (H100: 75, 83.9)" \
        recorded pair_pct_of_solo="$(mps_pct "$(sum "$ra" "$rb")")"
fi
d="$WORK/mps-pair-infer"
if mps_case "MPS 50/50 small-kernel clients" "$d" 100; then
    mps_pair "$d" infer 50 50
    both=$(sum "$(cat "$d/a.rate")" "$(cat "$d/b.rate")")
    small=$(num "${SOLO[infer]:-}" && num "$both" && awk -v s="$both" -v o="${SOLO[infer]}" 'BEGIN { printf "%.2f", s / o }')
    check "MPS 50/50 small kernels: pair > 1.5x one alone" "$(atleast "$small" 1.501)" \
        "$([ -n "$small" ] && echo "pair ${small}x one client alone (H100: 1.58)" || echo "no figure: $(why "$d/a")")" "> 1.5 x one alone" ratio="$small"
fi
d="$WORK/mps-limit"
if mps_case "MPS server at 30" "$d" 30; then
    raised=$(mps_pct "$(mps_run "$d/raised" "$d" 100 matmul "$S")")
    lowered=$(mps_pct "$(mps_run "$d/lowered" "$d" 10 matmul "$S")")
    mps_stop "$d"
    h30=$(times "$MPS_HELD" 30); h10=$(times "$MPS_HELD" 10)
    # a full-GPU kernel held to 30 % of the SMs runs at MPS_HELD of them (docs/compute.md, "MPS")
    check "MPS server at 30: a client's variable at 100 does not raise it" "$(within "$raised" "$h30" 3)" \
        "$(sol "$raised" "$(why "$d/raised")") (H100: 24.6, 25.1)" "$h30 +- 3 % of solo ($MPS_HELD x 30)" pct_of_solo="$raised"
    check "MPS server at 30: a client's variable at 10 lowers it" "$(within "$lowered" "$h10" 3)" \
        "$(sol "$lowered" "$(why "$d/lowered")") (H100: 8.0)" "$h10 +- 3 % of solo ($MPS_HELD x 10)" pct_of_solo="$lowered"
fi
# The library under an MPS claim's limits file (docs/strategies.md, hook/src/pacing.c mps_scale):
# it books launches in SM-time (GPU time x the SMs cuCtxGetExecAffinity gives the context), so a
# client at the 30 % share runs at it without a word; two processes of the claim share the 30 %
# (MPS alone gives each 30 %); without the pipe folder a plain context costs the whole GPU and is
# paced to 30 %. Settles what the simulator assumes: an MPS context reports its SM limit, a plain
# one none. A client held by MPS to 30 % of the SMs does MPS_HELD x 30 % of its solo work.
d="$WORK/mps-claim"
if mps_case "MPS claim at 30" "$d" 30; then
    claim "$d/claim" 30
    printf 'GPUSHARE_SHARING_STRATEGY=MPS\nGPUSHARE_SM_COUNT_0=%s\n' "$SMS" >> "$d/claim/limits"
    h30=$(times "$MPS_HELD" 30)
    held=$(mps_pct "$(mps_run "$d/held" "$d" - matmul "$W" "$d/claim")")
    held_said=$(grep -ho "MPS claim: .*" "$d/held.err" 2>/dev/null | head -1)
    AT=$([ "$SIM" = 0 ] && at_in "$LEAD")
    mps_run "$d/one" "$d" - matmul "$W" "$d/claim" > "$d/one.rate" & p1=$!
    two=$(mps_run "$d/two" "$d" - matmul "$W" "$d/claim"); wait $p1; AT=
    both=$(mps_pct "$(sum "$(cat "$d/one.rate")" "$two")")
    plain=$(mps_pct "$(mps_run "$d/plain" "" - matmul "$W" "$d/claim")")
    plain_said=$(grep -ho "MPS claim: .*" "$d/plain.err" 2>/dev/null | head -1)
    mps_stop "$d"
    check "MPS claim: a client at its 30 % share, unheld by the library" "$(if [ -z "$held_said" ]; then within "$held" "$h30" 3; else echo 0; fi)" \
        "$(sol "$held" "$(why "$d/held")"); the library said ${held_said:-nothing}" \
        "$h30 +- 3 % of solo (MPS: $MPS_HELD x 30), the library silent" pct_of_solo="$held"
    check "MPS claim: two processes share the 30 %" "$(within "$both" "$h30" 4)" "$(sol "$both" "$(why "$d/one")") together" \
        "$h30 +- 4 % of solo together" pct_of_solo="$both"
    check "MPS claim: no pipe folder, paced to 30 %" "$([ -n "$plain_said" ] && within "$plain" 30 3 || echo 0)" \
        "$(sol "$plain" "$(why "$d/plain")"); ${plain_said:-the library said nothing}" "30 +- 3 % of solo" pct_of_solo="$plain"
fi
d="$WORK/mps-latency"
if mps_case "MPS 50/50: inference client beside a busy one" "$d" 50; then
    if [ "$SIM" = 0 ] && [ -n "$SOLO_SERVE" ]; then lat_alone=$SOLO_SERVE; else lat_alone=$(mps_run "$d/alone" "" - serve "$S"); fi
    [ "$SIM" = 1 ] || AT=$(at_in "$LEAD")
    mps_run "$d/nb" "$d" - infer $((S + 2)) > /dev/null & nb=$!
    [ "$SIM" = 1 ] && sleep 0.5
    lat_mps=$(mps_run "$d/client" "$d" - serve "$S"); wait $nb; AT=
    mps_stop "$d"
    check "MPS 50/50: inference client beside a busy one (recorded)" 1 \
        "p50/p99 alone $(val p50_ms <<< "$lat_alone")/$(val p99_ms <<< "$lat_alone"), MPS $(fig "$(val p50_ms <<< "$lat_mps")" "$d/client")/$(val p99_ms <<< "$lat_mps") ms" \
        recorded p50_alone="$(val p50_ms <<< "$lat_alone")" p99_alone="$(val p99_ms <<< "$lat_alone")" \
        p50_mps="$(val p50_ms <<< "$lat_mps")" p99_mps="$(val p99_ms <<< "$lat_mps")"
fi
# priority: Latency (docs/compute.md, "Latency"): the client's streams NORMAL, a busy Batch
# matmul client's BELOW_NORMAL, as the plugin's CDI spec sets them; the client's p99 against its
# p99 alone on the GPU (target <= 1.5x), and the batch client's speed alone and beside it
d="$WORK/mps-latency-option"
if mps_case "priority Latency, MPS 50/50" "$d" 50; then
    batch_alone=$(mps_pct "$(CUDA_MPS_CLIENT_PRIORITY=1 mps_run "$d/batch-alone" "$d" - matmul "$S")")
    # the client alone on its 50 % of the SMs: what the partition costs it with no neighbour (on the
    # simulator a client whose kernels fill the GPU runs at half speed there; a memory-bound batch-1
    # kernel may not: docs/compute.md, "Latency")
    lat_share=$(CUDA_MPS_CLIENT_PRIORITY=0 mps_run "$d/share" "$d" - serve "$S")
    [ "$SIM" = 1 ] || AT=$(at_in "$LEAD")
    CUDA_MPS_CLIENT_PRIORITY=1 mps_run "$d/batch" "$d" - matmul $((W + 2)) > "$d/batch.rate" & nb=$!
    [ "$SIM" = 1 ] && sleep 0.5
    lat_opt=$(CUDA_MPS_CLIENT_PRIORITY=0 mps_run "$d/client" "$d" - serve "$W"); wait $nb; AT=
    mps_stop "$d"
    p99a=$(val p99_ms <<< "${lat_alone:-}"); p99o=$(val p99_ms <<< "$lat_opt")
    check "priority Latency, MPS 50/50: client p99 <= 1.5x alone beside a Batch matmul" \
        "$(atmost "$p99o" "$(times "${p99a:-0}" 1.5)")" \
        "p50/p99 alone $(val p50_ms <<< "${lat_alone:-}")/$p99a, alone at its share $(val p50_ms <<< "$lat_share")/$(val p99_ms <<< "$lat_share"), beside $(val p50_ms <<< "$lat_opt")/${p99o:-no figure: $(why "$d/client")} ms; batch ${batch_alone}% of solo alone, $(mps_pct "$(cat "$d/batch.rate")")% beside" \
        "<= 1.5 x the p99 alone" p99_alone="$p99a" p99_beside="$p99o" p99_share="$(val p99_ms <<< "$lat_share")" \
        batch_alone_pct="$batch_alone" batch_beside_pct="$(mps_pct "$(cat "$d/batch.rate")")"
fi
fi  # section 6

if section 7 "issue 29: the simulator's calibration and the untuned share cases, with the probe"; then
# With the probe's spin kernels (so it runs with --sim too): what the simulator is calibrated to
# (docs/compute.md, "The simulated GPU": no library), then the untuned cases of hack/bench-share
# under the library and the node agent's slots. A claim's share is its probe's launch rate over
# the rate of the same kernel alone without the library. Record the figures in
# docs/validation.md: on a GPU they settle the simulator's calibration.
CASE="calibration"
p7solo 2650 > /dev/null; r2650=${P7SOLO[2650]}
p7 launch --seconds "$S" --kernel-us 2650 > "$WORK/p7a" & pa=$!
p7 launch --seconds "$S" --kernel-us 2650 > "$WORK/p7b"; wait $pa
together=$(pct "$(sum "$(val launches_per_s < "$WORK/p7a")" "$(val launches_per_s < "$WORK/p7b")")" "$r2650")
check "two busy 2.65 ms-kernel contexts together (recorded)" 1 "${together:-?}% of solo (H100 2026-11-28: 117.3, the probe alone leaves the GPU idle between kernels; simulator 89.6)" \
    recorded together_pct="$together"
alone_t=$(p7 time --count 20 --kernel-us 2650)
p7 launch --seconds 4 --kernel-us 2650 > /dev/null & nb=$!; sleep 0.5
beside_t=$(p7 time --count 100 --kernel-us 2650)
lat_beside=$(p7 serve --seconds 3); wait $nb
check "2.65 ms kernel's event pair alone / beside a busy one (recorded)" 1 \
    "$(val median_ms <<< "$alone_t") / median $(val median_ms <<< "$beside_t"), p90 $(val p90_ms <<< "$beside_t") ms (H100: 2.65 / 5.16, 7.7; 2026-11-28: 2.656 / 4.543, 4.560)" \
    recorded alone_ms="$(val median_ms <<< "$alone_t")" beside_median_ms="$(val median_ms <<< "$beside_t")" beside_p90_ms="$(val p90_ms <<< "$beside_t")"
check "probe client beside a busy context, no library (recorded)" 1 \
    "p50 $(val p50_ms <<< "$lat_beside"), p99 $(val p99_ms <<< "$lat_beside") ms (H100 2026-11-28: 2.440, 2.465; PyTorch client: 0.49, 2.91)" \
    recorded p50_ms="$(val p50_ms <<< "$lat_beside")" p99_ms="$(val p99_ms <<< "$lat_beside")"
p7solo 1 > /dev/null
check "probe launch rate, 1 us kernels, alone (recorded)" 1 "${P7SOLO[1]} launches/s (H100 2026-11-28: 298,845)" recorded per_s="${P7SOLO[1]}"
# untuned NAME SPEC...: SPEC = LIMIT:POLICY:KERNEL_US[:probe args, commas for spaces]; each claim
# within 2 points of its limit (a bursty Hard claim: recorded), the GPU >= 95 % busy where a
# Burst claim has work
untuned() {
    local name=$1 d="$WORK/u$RANDOM" i=0 spec dirs=() pids=() busy=0 burst=0; shift
    begin_case "$name" || return 0
    for spec in "$@"; do claim "$d/c$i" "$(cut -d: -f1 <<< "$spec")" "$(cut -d: -f2 <<< "$spec")"; dirs+=("$d/c$i"); i=$((i + 1)); done
    for spec in "$@"; do p7solo "$(cut -d: -f3 <<< "$spec")" > /dev/null; done  # before the agent: alone
    agent "${dirs[@]}" || return 0
    i=0
    for spec in "$@"; do
        local us extra; us=$(cut -d: -f3 <<< "$spec"); extra=$(cut -d: -f4 <<< "$spec" | tr , ' ')
        # shellcheck disable=SC2086  # extra: the probe's words
        go "${dirs[$i]}" under "${dirs[$i]}" "$PROBE" launch --seconds "$W" --kernel-us "$us" $extra & pids+=($!)
        i=$((i + 1))
    done
    wait "${pids[@]}"; agent_stop
    i=0
    for spec in "$@"; do
        local limit policy us got; IFS=: read -r limit policy us _ <<< "$spec"
        got=$(pct "$(lps_of "${dirs[$i]}")" "${P7SOLO[$us]:-}")
        [ -n "$got" ] && busy=$(sum "$busy" "$got")
        if [ -z "$got" ]; then check "$name: $policy $limit" 0 "no figure: $(why "${dirs[$i]}")"
        elif [ "$policy" = Burst ]; then burst=1
        elif [[ "$spec" == *on-ms* ]]; then check "$name: bursty $policy $limit (recorded)" 1 "${got}% of the GPU" recorded pct="$got"
        else check "$name: $policy $limit within 2 points" "$(within "$got" "$limit" 2)" "${got}%" "$limit +- 2 %" pct="$got"; fi
        i=$((i + 1))
    done
    if [ "$burst" = 1 ]; then check "$name: GPU >= 95% busy" "$(atleast "$busy" 95)" "${busy}% busy" ">= 95 %" busy_pct="$busy"
    else check "$name: GPU busy (recorded)" 1 "${busy}%" recorded busy_pct="$busy"; fi
}
# On a GPU, unless UNTUNED=all: the basic case and those the H100 left open on 2026-11-28 (the
# others passed there: 9.9; 0.8 / 98.4; Hard 47.2 % with the GPU 99 % busy; 29.5 / 68.5)
all_untuned() { [ "$SIM" = 1 ] || [ "${UNTUNED:-open}" = all ]; }
untuned "3 tenants 10/30/60, 2.65 ms" 10:Hard:2650 30:Hard:2650 60:Hard:2650
all_untuned && untuned "Hard 10 alone, 5 ms" 10:Hard:5000
all_untuned && untuned "1 % beside 99 %, 2.65 ms" 1:Hard:2650 99:Hard:2650
untuned "30/70, 4 us kernels" 30:Hard:4 70:Hard:4
all_untuned && untuned "bursty Hard 50 + steady Burst 50" 50:Hard:2650:--on-ms,50,--off-ms,50 50:Burst:2650
untuned "3 tenants 20/30/50: 2.65 ms, 50 us, 4 us" 20:Hard:2650 30:Hard:50 50:Hard:4
all_untuned && untuned "30/70, the 30 on 8 streams" 30:Hard:2650:--streams,8 70:Hard:2650
untuned "Hard 10 of 12 ms kernels beside Hard 90" 10:Hard:12000 90:Hard:2650
CASE="probe solo rates"
solos=()
for us in "${!P7SOLO[@]}"; do solos+=("us_$us=${P7SOLO[$us]}"); done
check "the probe's solo rates, launches/s by kernel length (recorded)" 1 "${solos[*]}" recorded "${solos[@]}"
fi  # section 7



COMPLETE=true
SECTION=-
echo
echo "== $NOK ok, $NFAIL failed, $NSKIP skipped, in ${SECONDS} s${OUTDIR:+; figures in $OUTDIR/gpu-validate.json}"
printf '%-5s %-4s %-62s %s\n' "sect" "" "check" "detail"
printf '%s\n' "${LINES[@]}"
[ "$NFAIL" = 0 ]
