#!/usr/bin/env bash
# Measures what gpustore needs per simulated GPU, for deploy/kubernetes'
# requests and limits (README "Sizing"). gpustore runs alone with every role
# (-target=all, the embedded folder bucket, the GPU rule pack) and is fed by
# gpusim's HGX-shaped nodes (8 GPUs, 224 CPUs each) as a Prometheus HA pair
# at 15 s:
#   1. backfill: HISTORY of history as fast as gpustore takes it, one
#      replica, one request at a time (a lagging shard or replica would
#      write below the head once it cuts a block); the head fills and cuts
#      its oldest 2 h blocks, which are shipped to the bucket;
#   2. real time: REALTIME seconds of live writes (ingest, the rule pack,
#      shipping: the steady CPU);
#   3. queries: ROUNDS rounds of bench/load's 22 dashboard panels over the
#      last 1 h and 3 h (CPU per panel query, peak memory).
# Read from gpustore's own /metrics and /proc: CPU-seconds (process_cpu_
# seconds_total), RSS (process_resident_memory_bytes, VmHWM), head series,
# samples written, and the bytes of WAL, local blocks and bucket. On a
# shared machine CPU-seconds and memory are what to trust, not latency.
#
#   deploy/kubernetes/sizing.sh                 # 16 nodes (128 GPUs), 5h, 300 s
#   NODES=8 HISTORY=4h REALTIME=120 deploy/kubernetes/sizing.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
NODES=${NODES:-16}
HISTORY=${HISTORY:-5h}
ROUNDS=${ROUNDS:-10}
REALTIME=${REALTIME:-300}
PORT=${PORT:-19201}
OUT=${OUT:-$(mktemp -d /tmp/gpustore-sizing.XXXXXX)}
mkdir -p "$OUT/bin"
export GOFLAGS="${GOFLAGS:-} -tags=dedupelabels"
go build -o "$OUT/bin/" ./cmd/gpustore ./bench/cmd/gpusim ./bench/cmd/loadgen

URL=http://127.0.0.1:$PORT
"$OUT/bin/gpustore" --storage.tsdb.path="$OUT/data" --web.listen-address=127.0.0.1:$PORT \
  --log.level=warn >"$OUT/gpustore.log" 2>&1 &
GS=$!
trap 'kill $GS 2>/dev/null; wait $GS 2>/dev/null' EXIT
for _ in $(seq 1 100); do curl -sf $URL/-/ready >/dev/null && break; sleep 0.2; done

# metric NAME [LABELS]: the value of one series on gpustore's /metrics.
metric() { curl -s $URL/metrics | awk -v n="$1" -v l="${2:-}" '$1 == n l || (l == "" && $1 == n) { print $2 }'; }
samples() { metric gpustore_ingest_written_total '{tenant="default",type="sample"}'; }
cpu() { metric process_cpu_seconds_total; }
hwm_kib() { awk '/VmHWM/ { print $2 }' /proc/$GS/status; }
bytes() { du -sb "$1" 2>/dev/null | cut -f1; }

cpu0=$(cpu); s0=$(samples); rss0=$(metric process_resident_memory_bytes)
"$OUT/bin/gpusim" backfill --cluster.nodes="$NODES" --replicas=1 --backfill.duration="$HISTORY" \
  --remote-write.shards=1 --remote-write.url=$URL/api/v1/write --log.level=warn
cpu1=$(cpu); s1=$(samples)
series=$(metric gpustore_tsdb_head_series '{tenant="default"}')
rss1=$(metric process_resident_memory_bytes)
wal=$(bytes "$OUT/data/tenants/default/wal")

t0=$(date +%s)
timeout --signal=INT "$REALTIME" "$OUT/bin/gpusim" write --cluster.nodes="$NODES" --replicas=2 \
  --remote-write.url=$URL/api/v1/write --log.level=warn || true
t1=$(date +%s)
cpu2=$(cpu); s2=$(samples)
rss2=$(metric process_resident_memory_bytes)
c3=$(cpu)
"$OUT/bin/loadgen" query -url $URL -windows 1h,3h -rounds "$ROUNDS" -warmup 1 >"$OUT/queries.txt" 2>&1
c4=$(cpu)
# The first 2 h block reaches the bucket (the shipper's next pass).
for _ in $(seq 1 60); do [ -n "$(find "$OUT/data/bucket" -name meta.json 2>/dev/null)" ] && break; sleep 2; done
# The largest block (a whole 2 h one; the first is cut short at a 2 h
# boundary, and its index weighs more per sample): bytes and samples.
largest=$(for m in $(find "$OUT/data/bucket" -name meta.json); do
  echo "$(bytes "$(dirname "$m")") $(grep -o '"numSamples": *[0-9]*' "$m" | tr -dc '0-9')"
done | sort -n | tail -1)
nblocks=$(find "$OUT/data/bucket" -name meta.json | wc -l)
blocks=${largest% *} block_samples=${largest#* }

awk -v nodes="$NODES" -v series="$series" -v cpu0="$cpu0" -v cpu1="$cpu1" -v cpu2="$cpu2" \
  -v s0="$s0" -v s1="$s1" -v s2="$s2" -v rss0="$rss0" -v rss1="$rss1" -v rss2="$rss2" -v hwm="$(hwm_kib)" \
  -v wal="$wal" -v history="$HISTORY" -v qcpu="$(awk -v a="$c3" -v b="$c4" 'BEGIN { print b - a }')" -v queries="$((ROUNDS * 22 * 2))" -v secs="$((t1 - t0))" -v blocks="$blocks" -v nblocks="$nblocks" -v bsamples="${block_samples:-0}" 'BEGIN {
  gpus = nodes * 8
  printf "cluster: %d nodes, %d GPUs, %d head series (%.1f per GPU)\n", nodes, gpus, series, series / gpus
  printf "backfill: %.0f samples written, %.1f CPU-s, %.2f CPU-s per million samples\n", s1 - s0, cpu1 - cpu0, (cpu1 - cpu0) / (s1 - s0) * 1e6
  printf "RSS: %.0f MiB idle, %.0f MiB after the backfill, %.0f MiB after real time, peak %.0f MiB; %.2f KiB per series above idle (peak)\n", rss0 / 2^20, rss1 / 2^20, rss2 / 2^20, hwm / 1024, (hwm * 1024 - rss0) / series / 1024
  printf "real time: %d s, %.0f samples (%.0f/s), %.2f CPU-s = %.3f cores (%.2f CPU-s per million samples)\n", secs, s2 - s1, (s2 - s1) / secs, cpu2 - cpu1, (cpu2 - cpu1) / secs, (cpu2 - cpu1) / (s2 - s1) * 1e6
  printf "WAL after %s of history: %.0f MiB, %.0f bytes per head series\n", history, wal / 2^20, wal / series
  printf "queries: %d dashboard panel queries (1 h and 3 h windows), %.1f CPU-s, %.1f CPU-ms per query\n", queries, qcpu, qcpu / queries * 1000
  if (bsamples > 0) printf "bucket: %d blocks; the largest %.1f MiB, %.0f samples, %.3f bytes per sample\n", nblocks, blocks / 2^20, bsamples, blocks / bsamples
}'
echo "data and logs: $OUT"
