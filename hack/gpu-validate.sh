#!/usr/bin/env bash
# Validate libgpushare.so on a machine with an NVIDIA GPU, the driver and PyTorch.
# Builds the library, then checks against the real driver:
#   1. the probe: OOM at the limit, cuMemGetInfo/NVML report the limit
#   2. PyTorch: allocations past the limit raise torch.cuda.OutOfMemoryError,
#      torch.cuda.mem_get_info shows the limit
#   3. two processes on one region share the budget
#   4. two claims at 30 % and 70 % get throughput in that ratio (within 5 points)
#   5. launch overhead with and without the library
# Prints a table; exits non-zero if a check fails. Usage: hack/gpu-validate.sh [GPU index]
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
GPU=${1:-0}
LIMIT=$((2 * 1024 * 1024 * 1024))     # 2 GiB
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
PY=${PYTHON:-python3}

make -s -C "$REPO/hook"
LIB=$REPO/hook/build/libgpushare.so
PROBE=$REPO/hook/build/gpushare-probe
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i "$GPU")

# claim DIR COMPUTE: a run dir laid out as docs/interfaces.md says
claim() {
    mkdir -p "$1/region"
    cat > "$1/limits" <<LIMITS
GPUSHARE_LIMITS_VERSION=1
GPUSHARE_GPU_COUNT=1
GPUSHARE_DEVICE_UUID_0=$UUID
GPUSHARE_MEMORY_LIMIT_0=$LIMIT
GPUSHARE_COMPUTE_LIMIT_0=$2
GPUSHARE_COMPUTE_POLICY_0=Hard
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

# 4. two claims at 30 % and 70 %: throughput ratio
cat > "$WORK/torch_tput.py" <<'PYEOF'
import time, torch
a = torch.randn(4096, 4096, device="cuda")
torch.cuda.synchronize()
n, end = 0, time.time() + 10
while time.time() < end:
    a = a @ a; a /= a.norm(); n += 1
torch.cuda.synchronize()
print(f"iters={n}")
PYEOF
claim "$WORK/c30" 30
claim "$WORK/c70" 70
under "$WORK/c30" "$PY" "$WORK/torch_tput.py" > "$WORK/t30" &
p30=$!
under "$WORK/c70" "$PY" "$WORK/torch_tput.py" > "$WORK/t70" &
p70=$!
wait $p30 $p70
i30=$(val iters < "$WORK/t30"); i70=$(val iters < "$WORK/t70")
share30=$(awk -v a="$i30" -v b="$i70" 'BEGIN { printf "%.1f", 100 * a / (a + b) }')
check "30/70 claims: throughput split within 5 points" \
    "$(awk -v s="$share30" 'BEGIN { print (s >= 25 && s <= 35) ? 1 : 0 }')" "30% claim got ${share30}% (iters $i30 vs $i70)"

# 5. launch overhead (tiny kernels): probe launch rate without and with the library (limit 100)
plain=$(CUDA_VISIBLE_DEVICES=$GPU "$PROBE" launch --seconds 3 --kernel-us 1 | val launches_per_s)
hooked=$(under "$WORK/a" "$PROBE" launch --seconds 3 --kernel-us 1 | val launches_per_s)
claim "$WORK/c50" 50
paced=$(under "$WORK/c50" "$PROBE" launch --seconds 3 --kernel-us 200 | val busy_share)
check "launch rate, 1 us kernels: without / with library" 1 "$plain / $hooked launches/s"
check "probe busy share at compute limit 50" \
    "$(awk -v s="$paced" 'BEGIN { print (s >= 45 && s <= 55) ? 1 : 0 }')" "busy_share=$paced"

echo
printf '%-52s %-4s %s\n' "check" "" "detail"
printf '%s\n' "${RESULTS[@]}"
exit $FAILED
