#!/usr/bin/env bash
# Validate libgpushare.so on a machine with an NVIDIA GPU, the driver and PyTorch.
# Builds the library, then checks against the real driver:
#   1. the probe: OOM at the limit, cuMemGetInfo/NVML report the limit
#   2. PyTorch: allocations past the limit raise torch.cuda.OutOfMemoryError,
#      torch.cuda.mem_get_info shows the limit
#   3. two processes on one region share the budget
#   4. compute shares (issue 10; the node agent's slots running as in a cluster, through
#      `gpushare-dra share-agent` over the run dirs): 30/70 with matmul, elementwise and mixed
#      kernels within 3 points of each claim's share of solo speed, the pair >= 90 % of solo;
#      torch.cuda.graph capture and replay, torch.compile reduce-overhead, a JAX jit loop and a
#      Triton kernel (when installed) alone at 50 within 3 points; Burst 30 alone >= 90 %; an
#      inference-like client's p50/p99 solo, beside a busy neighbour without the library, and
#      under the library at 50/50
#   5. launch overhead with and without the library
#   6. MPS (issue 20): an nvidia-cuda-mps-control daemon with its own pipe directory; 30/70
#      matmul clients (each lowering the server's 100 % with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE):
#      the 30-client's part of the pair's work within 3 points, the pair's work vs solo
#      recorded (the H100: 75 %); two small-kernel inference clients (batch-1 MLP) at 50/50 do
#      more than 1.5x one alone; a server at 30 holds a client whose variable says 100, a
#      client at 10 gets 10; an inference client's p50/p99 beside a busy one; `priority: Latency`:
#      the client (CUDA_MPS_CLIENT_PRIORITY 0) beside a Batch matmul (1), p99 <= 1.5x alone
#   7. issue 29 (also with --sim): the simulator's calibration figures (two busy contexts, a
#      kernel's event pair beside a busy one, a client's latency, the launch rate) and the
#      untuned share cases of hack/bench-share, with the probe
# Prints a table; exits non-zero if a check fails.
#   hack/gpu-validate.sh [--mps-only] [GPU index]
#   hack/gpu-validate.sh --sim      the MPS cases and section 7 on the simulated GPU (hook/build/sim,
#                                   its simulated MPS server and the probe instead of PyTorch)
# (SHARE_SECONDS=15 by default: the window of each share measurement; not SECONDS, which bash
# sets to the shell's age. PYTHON: the workloads' python, python3 by default; AGENT_PYTHON: the
# share agent's, with the project's packages, PYTHON by default)
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
SIM=0
MPS_ONLY=0
while [ $# -gt 0 ]; do
    case $1 in
        --sim) SIM=1; MPS_ONLY=1 ;;
        --mps-only) MPS_ONLY=1 ;;
        -*) echo "gpu-validate: unknown option $1 (expected --sim, --mps-only, a GPU index)" >&2; exit 64 ;;
        *) break ;;
    esac
    shift
done
GPU=${1:-0}
LIMIT=$((2 * 1024 * 1024 * 1024))     # 2 GiB
WORK=$(mktemp -d)
MPS_DIRS=()  # control daemons started here: told to quit on exit
# shellcheck disable=SC2317  # called by the trap
cleanup() {
    jobs -p | xargs -r kill 2>/dev/null || true
    for d in "${MPS_DIRS[@]}"; do mps_stop "$d"; done
    rm -rf "$WORK"
}
trap cleanup EXIT
PY=${PYTHON:-python3}             # the workloads' python (PyTorch, JAX, Triton where installed)
AGENT_PY=${AGENT_PYTHON:-$PY}     # the share agent's: the project's packages (pip install -e ., or .venv/bin/python)
if ! (cd "$REPO" && "$AGENT_PY" -c 'import dra_driver.log, kubeletplugin.agent.standalone') 2>/dev/null; then
    echo "gpu-validate: $AGENT_PY cannot import the share agent (its packages: pip install -e $REPO); set" \
         "AGENT_PYTHON to a python that can (e.g. $REPO/.venv/bin/python after make -C $REPO .venv/.installed)" >&2
    exit 2
fi
SECONDS_SHARE=${SHARE_SECONDS:-15}

make -s -C "$REPO/hook"
LIB=$REPO/hook/build/libgpushare.so
PROBE=$REPO/hook/build/gpushare-probe
if [ "$SIM" = 1 ]; then
    export LD_LIBRARY_PATH=$REPO/hook/build/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} GPUSHARE_SIM_STATE=$WORK/sim.state
fi

# claim DIR COMPUTE [POLICY]: a run dir laid out as docs/interfaces.md says
claim() {
    mkdir -p "$1/region"
    cat > "$1/limits" <<LIMITS
GPUSHARE_LIMITS_VERSION=1
GPUSHARE_GPU_COUNT=1
GPUSHARE_DEVICE_UUID_0=${UUID:-}
GPUSHARE_MEMORY_LIMIT_0=$LIMIT
GPUSHARE_COMPUTE_LIMIT_0=$2
GPUSHARE_COMPUTE_POLICY_0=${3:-Hard}
LIMITS
    truncate -s 1M "$1/region/0"
}
under() { local dir=$1; shift; CUDA_VISIBLE_DEVICES=$GPU GPUSHARE_RUN_DIR=$dir LD_PRELOAD=$LIB "$@"; }
val() { grep -o "$1=[^ ]*" | tail -1 | cut -d= -f2; }

RESULTS=()
FAILED=0
check() { # name, ok(0/1), detail
    RESULTS+=("$(printf '%-52s %-4s %s' "$1" "$([ "$2" = 1 ] && echo ok || echo FAIL)" "$3")")
    [ "$2" = 1 ] || FAILED=1
}

if [ "$MPS_ONLY" = 0 ]; then
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i "$GPU")
# 1. probe
claim "$WORK/a" 100
allocated=$(under "$WORK/a" "$PROBE" alloc --chunk 256Mi | val allocated)
check "probe: OOM exactly at the limit" "$([ "$allocated" = "$LIMIT" ] && echo 1 || echo 0)" "allocated=$allocated"
info=$(under "$WORK/a" "$PROBE" meminfo)
cu_total=$(echo "$info" | val cu_total); nvml_total=$(echo "$info" | val nvml_total)
check "probe: cuMemGetInfo and NVML report the limit" \
    "$([ "$cu_total" = "$LIMIT" ] && [ "$nvml_total" = "$LIMIT" ] && echo 1 || echo 0)" \
    "cu_total=$cu_total nvml_total=$nvml_total"

# 2. PyTorch
cat > "$WORK/torch_oom.py" <<'PYEOF'
import sys, torch
limit = int(sys.argv[1])
free, total = torch.cuda.mem_get_info()
print(f"total={total} free={free}")
blocks = []
try:
    while True:
        blocks.append(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"))
except torch.cuda.OutOfMemoryError:
    print(f"oom=1 held={len(blocks) * (128 << 20)}")
PYEOF
out=$(under "$WORK/a" "$PY" "$WORK/torch_oom.py" "$LIMIT")
total=$(echo "$out" | val total); oom=$(echo "$out" | val oom); held=$(echo "$out" | val held)
check "torch: mem_get_info total == limit" "$([ "$total" = "$LIMIT" ] && echo 1 || echo 0)" "total=$total"
check "torch: OutOfMemoryError at the limit" \
    "$([ "$oom" = 1 ] && [ "$held" -le "$LIMIT" ] && echo 1 || echo 0)" "held=$held"

# 3. two processes, one region
under "$WORK/a" "$PROBE" alloc --chunk 256Mi --max 1Gi --hold 20 > "$WORK/holder.out" &
holder=$!
for _ in $(seq 100); do grep -q '^allocated=' "$WORK/holder.out" && break; sleep 0.1; done
second=$(under "$WORK/a" "$PROBE" alloc --chunk 256Mi | val allocated)
kill $holder 2>/dev/null || true; wait $holder 2>/dev/null || true
check "two processes share one budget" "$([ "$second" = $((LIMIT - 1024 * 1024 * 1024)) ] && echo 1 || echo 0)" \
    "second process got $second"

fi  # sections 1-3

# 4. compute shares, with the node agent's slots as in a cluster
cat > "$WORK/work.py" <<'PYEOF'
"""work.py KIND SECONDS: a loop of one kind of GPU work; prints iters= seconds= (serve: p50_ms= p99_ms=)."""
import sys, time
kind, seconds = sys.argv[1], float(sys.argv[2])

def loop(step, sync):
    for _ in range(3):
        step()
    sync()
    n, t0 = 0, time.time()
    while time.time() < t0 + seconds:
        step(); n += 1
    sync()
    print(f"iters={n} seconds={time.time() - t0:.3f}")

if kind in ("jax",):
    import jax, jax.numpy as jnp
    x = jnp.ones((4096, 4096), jnp.float32)
    f = jax.jit(lambda a: (a @ a) / 4096.0)
    state = {"x": x}
    def step(): state["x"] = f(state["x"])
    loop(step, lambda: state["x"].block_until_ready())
    sys.exit(0)
import torch
dev = "cuda"
a = torch.randn(4096, 4096, device=dev)
e = torch.randn(1 << 20, device=dev)
if kind == "matmul":
    loop(lambda: a.copy_(a @ a / 4096.0), torch.cuda.synchronize)
elif kind == "elementwise":
    loop(lambda: e.mul_(0.999).add_(0.001), torch.cuda.synchronize)
elif kind == "graph":
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            b = a @ a
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):  # fails with cudaErrorStreamCaptureInvalidated if the library breaks it
        b = a @ a
    loop(g.replay, torch.cuda.synchronize)
elif kind == "compile":
    f = torch.compile(lambda x: torch.relu(x @ x) / 4096.0, mode="reduce-overhead")
    loop(lambda: f(a), torch.cuda.synchronize)
elif kind == "triton":
    import triton, triton.language as tl
    @triton.jit
    def k(x_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        x = tl.load(x_ptr + i, mask=m)
        for _ in range(64):
            x = x * 0.999 + 0.001
        tl.store(x_ptr + i, x, mask=m)
    big = torch.randn(1 << 26, device=dev)
    loop(lambda: k[(big.numel() // 1024,)](big, big.numel(), BLOCK=1024), torch.cuda.synchronize)
elif kind == "infer":  # batch-1 fp16 MLP of 8 x 4096 flat out: small kernels (MPS's case)
    layers = [torch.randn(4096, 4096, device=dev, dtype=torch.half) / 64 for _ in range(8)]
    x = torch.randn(1, 4096, device=dev, dtype=torch.half)
    def step():
        y = x
        for w in layers:
            y = torch.relu(y @ w)
    loop(step, torch.cuda.synchronize)
elif kind == "serve":  # batch-1 fp16 MLP of 8 x 4096, a request every ~2.4 ms, each waited for
    layers = [torch.randn(4096, 4096, device=dev, dtype=torch.half) / 64 for _ in range(8)]
    x = torch.randn(1, 4096, device=dev, dtype=torch.half)
    lat, t0 = [], time.time()
    while time.time() < t0 + seconds:
        t = time.perf_counter()
        y = x
        for w in layers:
            y = torch.relu(y @ w)
        torch.cuda.synchronize()
        lat.append((time.perf_counter() - t) * 1e3)
        time.sleep(0.002)
    lat.sort()
    print(f"requests={len(lat)} p50_ms={lat[len(lat) // 2]:.3f} p99_ms={lat[int(len(lat) * 0.99)]:.3f}")
PYEOF
work() { "$PY" "$WORK/work.py" "$@"; }                       # without the library
rate() {  # iterations per second of a work.py output; a run that did no work stops the script
    local i s; i=$(echo "$1" | val iters); s=$(echo "$1" | val seconds)
    [[ "$i" =~ ^[1-9][0-9]*$ && "$s" =~ ^[0-9.]+$ ]] || { echo "gpu-validate: a work run did no work: '$1'" >&2; exit 2; }
    awk -v i="$i" -v s="$s" 'BEGIN { printf "%.3f", i / s }'
}
pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", 100 * a / b }'; }
within() { awk -v g="$1" -v t="$2" -v b="$3" 'BEGIN { print ((g >= t - b && g <= t + b) ? 1 : 0) }'; }
declare -A SOLO   # iterations per second of each kind alone on the GPU, without the library
if [ "$MPS_ONLY" = 0 ]; then
KINDS="matmul elementwise graph compile"
for kind in jax triton; do "$PY" -c "import $kind" 2>/dev/null && KINDS="$KINDS $kind"; done
for kind in $KINDS; do
    SOLO[$kind]=$(rate "$(CUDA_VISIBLE_DEVICES=$GPU work "$kind" 5)")
    [[ "${SOLO[$kind]}" =~ ^[0-9.]+$ ]] && [ "${SOLO[$kind]}" != 0.000 ] || { echo "gpu-validate: no solo rate for $kind" >&2; exit 2; }
done
solo() { echo "${SOLO[$1]}"; }
AGENT=
agent() {  # a share measurement without the agent's slots means nothing: stop the script
    "$AGENT_PY" -m dra_driver.cli share-agent --interval 0.25 --log-level warning "$@" & AGENT=$!; sleep 1
    kill -0 "$AGENT" 2>/dev/null || { echo "gpu-validate: share-agent exited at start (see above); is this package importable by $AGENT_PY?" >&2; exit 2; }
}
agent_stop() { kill "$AGENT" 2>/dev/null || true; wait "$AGENT" 2>/dev/null || true; }

# pair KIND30 KIND70: two Hard claims at 30 and 70, each claim's speed as a share of its solo speed
pair() {
    local d="$WORK/pair-$1-$2"; claim "$d/a" 30; claim "$d/b" 70
    (cd "$REPO" && agent "$d/a" "$d/b"
     under "$d/a" "$PY" "$WORK/work.py" "$1" "$SECONDS_SHARE" > "$d/a.out" & pa=$!
     under "$d/b" "$PY" "$WORK/work.py" "$2" "$SECONDS_SHARE" > "$d/b.out"; wait $pa
     agent_stop)
    local sa sb; sa=$(pct "$(rate "$(cat "$d/a.out")")" "$(solo "$1")"); sb=$(pct "$(rate "$(cat "$d/b.out")")" "$(solo "$2")")
    check "30/70 $1 vs $2: claim 30 within 3 points" "$(within "$sa" 30 3)" "claim 30 at ${sa}% of solo"
    check "30/70 $1 vs $2: claim 70 within 3 points" "$(within "$sb" 70 3)" "claim 70 at ${sb}% of solo"
    check "30/70 $1 vs $2: together >= 90% of solo" "$(awk -v a="$sa" -v b="$sb" 'BEGIN { print ((a + b >= 90) ? 1 : 0) }')" \
        "together $(awk -v a="$sa" -v b="$sb" 'BEGIN { print a + b }')%"
}
pair matmul matmul
pair elementwise elementwise
pair matmul elementwise

# alone KIND LIMIT [POLICY]: one claim alone; prints its speed as a share of solo, or the error
alone() {
    local d="$WORK/alone-$1-$2-${3:-Hard}"; claim "$d" "$2" "${3:-Hard}"
    (cd "$REPO" && agent "$d"; under "$d" "$PY" "$WORK/work.py" "$1" "$SECONDS_SHARE" > "$d.out" 2>&1; agent_stop)
    if grep -q '^iters=' "$d.out"; then pct "$(rate "$(cat "$d.out")")" "$(solo "$1")"; else tail -1 "$d.out"; fi
}
number() { [[ "$1" =~ ^[0-9.]+$ ]] && echo 1 || echo 0; }
for kind in graph compile jax triton; do
    case " $KINDS " in *" $kind "*) ;; *) check "$kind alone at 50" 1 "skipped: $kind not installed"; continue;; esac
    got=$(alone "$kind" 50)
    if [ "$(number "$got")" = 1 ]; then check "$kind alone at 50 within 3 points" "$(within "$got" 50 3)" "${got}% of solo"
    else check "$kind alone at 50" 0 "$got"; fi
done
got=$(alone matmul 30 Burst)
check "Burst 30 alone >= 90% of solo" "$(awk -v g="$got" 'BEGIN { print ((g >= 90) ? 1 : 0) }')" "${got}% of solo"

# latency of an inference-like client at 50 beside a busy matmul neighbour at 50
claim "$WORK/lc" 50; claim "$WORK/ln" 50
lat_solo=$(CUDA_VISIBLE_DEVICES=$GPU work serve 8)
CUDA_VISIBLE_DEVICES=$GPU work matmul 10 > /dev/null & nb=$!; sleep 1
lat_plain=$(CUDA_VISIBLE_DEVICES=$GPU work serve 8); wait $nb
(cd "$REPO" && agent "$WORK/lc" "$WORK/ln"
 under "$WORK/ln" "$PY" "$WORK/work.py" matmul 10 > /dev/null & pn=$!; sleep 1
 under "$WORK/lc" "$PY" "$WORK/work.py" serve 8 > "$WORK/lat.out"; wait $pn; agent_stop)
lat_lib=$(cat "$WORK/lat.out")
p50s=$(echo "$lat_solo" | val p50_ms); p50l=$(echo "$lat_lib" | val p50_ms)
p99p=$(echo "$lat_plain" | val p99_ms); p99l=$(echo "$lat_lib" | val p99_ms)
check "client under its share: p50 within 1.2x solo" "$(awk -v a="$p50l" -v b="$p50s" 'BEGIN { print ((a <= 1.2 * b) ? 1 : 0) }')" \
    "p50 solo $p50s, library $p50l ms"
check "client p99 no worse than plain time-slicing" "$(awk -v a="$p99l" -v b="$p99p" 'BEGIN { print ((a <= b) ? 1 : 0) }')" \
    "p99 solo $(echo "$lat_solo" | val p99_ms), time-slicing $p99p, library $p99l ms"

# 5. launch overhead (tiny kernels): probe launch rate without and with the library (limit 100)
plain=$(CUDA_VISIBLE_DEVICES=$GPU "$PROBE" launch --seconds 3 --kernel-us 1 | val launches_per_s)
hooked=$(under "$WORK/a" "$PROBE" launch --seconds 3 --kernel-us 1 | val launches_per_s)
claim "$WORK/c50" 50
paced=$(under "$WORK/c50" "$PROBE" launch --seconds 3 --kernel-us 200 | val busy_share)
check "launch rate, 1 us kernels: without / with library" 1 "$plain / $hooked launches/s"
check "probe busy share at compute limit 50" \
    "$(awk -v s="$paced" 'BEGIN { print ((s >= 45 && s <= 55) ? 1 : 0) }')" "busy_share=$paced"

fi  # sections 4-5 (work.py and its helpers above are for section 6 too)

# 6. MPS (issue 20). A control daemon with its own pipe directory whose servers give clients
# at most the default active-thread percentage; a client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
# may only lower it (NVIDIA's MPS documentation). With --sim: the simulated server
# (hook/sim/sim_mps.h: the file the trusted side writes in the pipe directory) and the probe's
# spin kernels instead of PyTorch: matmul = 0.5 ms kernels on every SM (short: what a client
# has queued drains soon at 10 %), infer = 0.41 ms kernels
# on a quarter of them, serve = the probe's inference-like client on a quarter of them.
mps_start() {  # DIR PERCENT: a control daemon (its servers' default active-thread percentage)
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
        CUDA_VISIBLE_DEVICES=$GPU CUDA_MPS_PIPE_DIRECTORY=$1/pipe CUDA_MPS_LOG_DIRECTORY=$1/log nvidia-cuda-mps-control -d
        echo "set_default_active_thread_percentage $2" | CUDA_MPS_PIPE_DIRECTORY=$1/pipe nvidia-cuda-mps-control > /dev/null
    fi
}
mps_stop() {
    if [ "$SIM" = 1 ]; then rm -f "$1/pipe/"*
    else echo quit | CUDA_MPS_PIPE_DIRECTORY=$1/pipe nvidia-cuda-mps-control > /dev/null 2>&1 || true; fi
}
SMS=132
[ "$SIM" = 1 ] || SMS=$(nvidia-smi --query-gpu=multiprocessor_count --format=csv,noheader -i "$GPU" 2>/dev/null || echo 132)
[[ "$SMS" =~ ^[0-9]+$ ]] || SMS=132
# mps_run DIR PERCENT|- KIND SECONDS [CLAIM]: one client (DIR "": no MPS) lowering its server's
# percentage to PERCENT; prints its rate (work per second; serve: the latency line). CLAIM: a
# claim dir whose library is preloaded; its stderr goes to CLAIM/stderr
mps_run() {
    local dir=$1 pct=$2 kind=$3 secs=$4 under_claim=${5:-} out
    local env=(CUDA_VISIBLE_DEVICES="$GPU")
    [ -n "$dir" ] && env+=(CUDA_MPS_PIPE_DIRECTORY="$dir/pipe")
    [ "$pct" != - ] && env+=(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="$pct")
    [ -n "$under_claim" ] && env+=(GPUSHARE_RUN_DIR="$under_claim" LD_PRELOAD="$LIB")
    exec 3>"${under_claim:-/dev/null}${under_claim:+/stderr}"
    if [ "$SIM" = 0 ]; then
        out=$(env "${env[@]}" "$PY" "$WORK/work.py" "$kind" "$secs" 2>&3)
        if [ "$kind" = serve ]; then echo "$out"; else rate "$out"; fi
        return
    fi
    case $kind in
        # a whole-GPU grid: an MPS client's default grid is its share's SMs (issue 27)
        matmul) out=$(env "${env[@]}" "$PROBE" launch --seconds "$secs" --kernel-us 500 --grid "$SMS" 2>&3) ;;
        infer) out=$(env "${env[@]}" "$PROBE" launch --seconds "$secs" --kernel-us 410 --grid $((SMS / 4))) ;;
        serve) env "${env[@]}" "$PROBE" serve --seconds "$secs" --grid $((SMS / 4)); return ;;
    esac
    awk -v d="$(echo "$out" | val done_in_window)" -v w="$(echo "$out" | val window_s)" 'BEGIN { printf "%.3f", d / w }'
}
# mps_pair KIND PCT_A PCT_B: two clients of one server at 100 lowering it to PCT_A / PCT_B;
# prints "rate_a rate_b"
mps_pair() {
    local d="$WORK/mps-pair-$1-$2-$3"; mps_start "$d" 100
    mps_run "$d" "$2" "$1" "$SECONDS_SHARE" > "$d/a.rate" & local pa=$!
    mps_run "$d" "$3" "$1" "$SECONDS_SHARE" > "$d/b.rate"; wait $pa
    mps_stop "$d"
    echo "$(cat "$d/a.rate") $(cat "$d/b.rate")"
}
for kind in matmul infer; do  # solo: alone on the GPU, no MPS
    [ -n "${SOLO[$kind]:-}" ] || SOLO[$kind]=$(mps_run "" - "$kind" 5)
done
read -r ra rb <<< "$(mps_pair matmul 30 70)"
s30=$(pct "$ra" "$(awk -v a="$ra" -v b="$rb" 'BEGIN { print a + b }')")
pair=$(pct "$(awk -v a="$ra" -v b="$rb" 'BEGIN { print a + b }')" "${SOLO[matmul]}")
check "MPS 30/70 matmul: client 30 within 3 points" "$(within "$s30" 30 3)" "client 30 did ${s30}% of the pair's work (H100: 30.1)"
check "MPS 30/70 matmul: the pair's work vs solo (recorded)" 1 "${pair}% of solo (H100: 75)"
read -r ra rb <<< "$(mps_pair infer 50 50)"
small=$(awk -v a="$ra" -v b="$rb" -v s="${SOLO[infer]}" 'BEGIN { printf "%.2f", (a + b) / s }')
check "MPS 50/50 small kernels: pair > 1.5x one alone" "$(awk -v x="$small" 'BEGIN { print ((x > 1.5) ? 1 : 0) }')" \
    "pair ${small}x one client alone"
d="$WORK/mps-limit"; mps_start "$d" 30
raised=$(pct "$(mps_run "$d" 100 matmul 5)" "${SOLO[matmul]}")
lowered=$(pct "$(mps_run "$d" 10 matmul 5)" "${SOLO[matmul]}")
mps_stop "$d"
check "MPS server at 30: a client's variable at 100 does not raise it" "$(within "$raised" 30 3)" "${raised}% of solo"
check "MPS server at 30: a client's variable at 10 lowers it" "$(within "$lowered" 10 3)" "${lowered}% of solo"
# The library under an MPS claim's limits file (docs/strategies.md, hook/src/pacing.c mps_scale):
# it books launches in SM-time (GPU time x the SMs cuCtxGetExecAffinity gives the context), so a
# client at the 30 % share runs at it without a word; two processes of the claim share the 30 %
# (MPS alone gives each 30 %); without the pipe folder a plain context costs the whole GPU and is
# paced to 30 %. Settles what the simulator assumes: an MPS context reports its SM limit, a plain
# one none.
d="$WORK/mps-claim"; mps_start "$d" 30
claim "$d/claim" 30
printf 'GPUSHARE_SHARING_STRATEGY=MPS\nGPUSHARE_SM_COUNT_0=%s\n' "$SMS" >> "$d/claim/limits"
held=$(pct "$(mps_run "$d" - matmul 5 "$d/claim")" "${SOLO[matmul]}")
held_said=$(grep -c "MPS claim:" "$d/claim/stderr" || true)
mps_run "$d" - matmul 5 "$d/claim" > "$d/one.rate" & p1=$!
two=$(mps_run "$d" - matmul 5 "$d/claim"); wait $p1
both=$(pct "$(awk -v a="$(cat "$d/one.rate")" -v b="$two" 'BEGIN { print a + b }')" "${SOLO[matmul]}")
plain=$(pct "$(mps_run "" - matmul 5 "$d/claim")" "${SOLO[matmul]}")
plain_said=$(grep -o "MPS claim: .*" "$d/claim/stderr" | head -1)
mps_stop "$d"
check "MPS claim: a client at its 30 % share, unheld" "$([ "$held_said" = 0 ] && within "$held" 30 3 || echo 0)" \
    "${held}% of solo; library said nothing"
check "MPS claim: two processes share the 30 %" "$(within "$both" 30 4)" "${both}% of solo together"
check "MPS claim: no pipe folder, paced to 30 %" "$([ -n "$plain_said" ] && within "$plain" 30 3 || echo 0)" \
    "${plain}% of solo; ${plain_said:-the library said nothing}"
d="$WORK/mps-latency"; mps_start "$d" 50
lat_alone=$(mps_run "" - serve 8)
mps_run "$d" - infer 10 > /dev/null & nb=$!; sleep 1
lat_mps=$(mps_run "$d" - serve 8); wait $nb
mps_stop "$d"
check "MPS 50/50: inference client beside a busy one (recorded)" 1 \
    "p50/p99 alone $(echo "$lat_alone" | val p50_ms)/$(echo "$lat_alone" | val p99_ms), MPS $(echo "$lat_mps" | val p50_ms)/$(echo "$lat_mps" | val p99_ms) ms"
# priority: Latency (docs/compute.md, "Latency"): the client's streams NORMAL, a busy Batch
# matmul client's BELOW_NORMAL, as the plugin's CDI spec sets them; the client's p99 against its
# p99 alone on the GPU (target <= 1.5x), and the batch client's speed alone and beside it
d="$WORK/mps-latency-option"; mps_start "$d" 50
batch_alone=$(pct "$(CUDA_MPS_CLIENT_PRIORITY=1 mps_run "$d" - matmul 5)" "${SOLO[matmul]}")
# the client alone on its 50 % of the SMs: what the partition costs it with no neighbour (on the
# simulator a client whose kernels fill the GPU runs at half speed there; a memory-bound batch-1
# kernel may not: docs/compute.md, "Latency")
lat_share=$(CUDA_MPS_CLIENT_PRIORITY=0 mps_run "$d" - serve 8)
CUDA_MPS_CLIENT_PRIORITY=1 mps_run "$d" - matmul 10 > "$d/batch.rate" & nb=$!; sleep 1
lat_opt=$(CUDA_MPS_CLIENT_PRIORITY=0 mps_run "$d" - serve 8); wait $nb
mps_stop "$d"
p99a=$(echo "$lat_alone" | val p99_ms); p99o=$(echo "$lat_opt" | val p99_ms)
check "priority Latency, MPS 50/50: client p99 <= 1.5x alone beside a Batch matmul" \
    "$(awk -v a="$p99o" -v b="$p99a" 'BEGIN { print ((a <= 1.5 * b) ? 1 : 0) }')" \
    "p50/p99 alone $(echo "$lat_alone" | val p50_ms)/$p99a, alone at its share $(echo "$lat_share" | val p50_ms)/$(echo "$lat_share" | val p99_ms), beside $(echo "$lat_opt" | val p50_ms)/$p99o ms; batch ${batch_alone}% of solo alone, $(pct "$(cat "$d/batch.rate")" "${SOLO[matmul]}")% beside"

# 7. issue 29, with the probe's spin kernels (so it runs with --sim too): what the simulator is
# calibrated to (docs/compute.md, "The simulated GPU": no library), then the untuned cases of
# hack/bench-share under the library and the node agent's slots. A claim's share is its probe's
# launch rate over the rate of the same kernel alone without the library. Record the figures in
# docs/validation.md: on a GPU they settle the simulator's calibration.
[ "$SIM" = 1 ] && UUID=${UUID:-GPU-5ea1c0de-0000-4000-8000-000000000000}
p7() { CUDA_VISIBLE_DEVICES=$GPU "$PROBE" "$@"; }
declare -A P7SOLO   # launches per second of KERNEL_US kernels alone, no library
p7solo() { [ -n "${P7SOLO[$1]:-}" ] || P7SOLO[$1]=$(p7 launch --seconds 3 --kernel-us "$1" | val launches_per_s); echo "${P7SOLO[$1]}"; }
r2650=$(p7solo 2650)
p7 launch --seconds 5 --kernel-us 2650 > "$WORK/p7a" & pa=$!
p7 launch --seconds 5 --kernel-us 2650 > "$WORK/p7b"; wait $pa
together=$(awk -v a="$(val launches_per_s < "$WORK/p7a")" -v b="$(val launches_per_s < "$WORK/p7b")" -v s="$r2650" \
    'BEGIN { printf "%.1f", 100 * (a + b) / s }')
check "two busy 2.65 ms-kernel contexts together (recorded)" 1 "${together}% of solo (H100, issue 29: 89.6; simulator 89.6)"
alone_t=$(p7 time --count 20 --kernel-us 2650)
p7 launch --seconds 6 --kernel-us 2650 > /dev/null & nb=$!; sleep 0.5
beside_t=$(p7 time --count 100 --kernel-us 2650)
lat_beside=$(p7 serve --seconds 4); wait $nb
check "2.65 ms kernel's event pair alone / beside a busy one (recorded)" 1 \
    "$(echo "$alone_t" | val median_ms) / median $(echo "$beside_t" | val median_ms), p90 $(echo "$beside_t" | val p90_ms) ms (H100: 2.65 / 5.16, 7.7)"
check "probe client beside a busy context, no library (recorded)" 1 \
    "p50 $(echo "$lat_beside" | val p50_ms), p99 $(echo "$lat_beside" | val p99_ms) ms (H100 PyTorch client: 0.49, 2.91)"
check "probe launch rate, 1 us kernels, alone (recorded)" 1 "$(p7solo 1) launches/s (H100 2026-11-24: 249,023-264,812)"
# untuned NAME SPEC...: SPEC = LIMIT:POLICY:KERNEL_US[:probe args, commas for spaces]; each claim
# within 2 points of its limit (a bursty Hard claim: recorded), the GPU >= 95 % busy where a
# Burst claim has work
untuned() {
    local name=$1 d="$WORK/u$RANDOM" i=0 spec dirs=() pids=() busy=0 burst=0; shift
    for spec in "$@"; do claim "$d/c$i" "$(cut -d: -f1 <<< "$spec")" "$(cut -d: -f2 <<< "$spec")"; dirs+=("$d/c$i"); i=$((i + 1)); done
    (cd "$REPO" && "$AGENT_PY" -m dra_driver.cli share-agent --interval 0.25 --log-level warning "${dirs[@]}") & local ag=$!; sleep 1
    i=0
    for spec in "$@"; do
        local us extra; us=$(cut -d: -f3 <<< "$spec"); extra=$(cut -d: -f4 <<< "$spec" | tr , ' ')
        # shellcheck disable=SC2086  # extra: the probe's words
        under "${dirs[$i]}" "$PROBE" launch --seconds "$SECONDS_SHARE" --kernel-us "$us" $extra > "${dirs[$i]}.out" & pids+=($!)
        i=$((i + 1))
    done
    wait "${pids[@]}"; kill "$ag" 2>/dev/null || true; wait "$ag" 2>/dev/null || true
    i=0
    for spec in "$@"; do
        local limit policy us got; IFS=: read -r limit policy us _ <<< "$spec"
        got=$(awk -v r="$(val launches_per_s < "${dirs[$i]}.out")" -v s="$(p7solo "$us")" 'BEGIN { printf "%.1f", 100 * r / s }')
        busy=$(awk -v a="$busy" -v g="$got" 'BEGIN { print a + g }')
        if [ "$policy" = Burst ]; then burst=1
        elif [[ "$spec" == *on-ms* ]]; then check "$name: bursty $policy $limit (recorded)" 1 "${got}% of the GPU"
        else check "$name: $policy $limit within 2 points" "$(within "$got" "$limit" 2)" "${got}%"; fi
        i=$((i + 1))
    done
    if [ "$burst" = 1 ]; then check "$name: GPU >= 95% busy" "$(awk -v b="$busy" 'BEGIN { print ((b >= 95) ? 1 : 0) }')" "${busy}% busy"
    else check "$name: GPU busy (recorded)" 1 "${busy}%"; fi
}
untuned "3 tenants 10/30/60, 2.65 ms" 10:Hard:2650 30:Hard:2650 60:Hard:2650
untuned "Hard 10 alone, 5 ms" 10:Hard:5000
untuned "1 % beside 99 %, 2.65 ms" 1:Hard:2650 99:Hard:2650
untuned "30/70, 4 us kernels" 30:Hard:4 70:Hard:4
untuned "bursty Hard 50 + steady Burst 50" 50:Hard:2650:--on-ms,50,--off-ms,50 50:Burst:2650
untuned "3 tenants 20/30/50: 2.65 ms, 50 us, 4 us" 20:Hard:2650 30:Hard:50 50:Hard:4
untuned "30/70, the 30 on 8 streams" 30:Hard:2650:--streams,8 70:Hard:2650
untuned "Hard 10 of 12 ms kernels beside Hard 90" 10:Hard:12000 90:Hard:2650

echo
printf '%-52s %-4s %s\n' "check" "" "detail"
printf '%s\n' "${RESULTS[@]}"
exit $FAILED
