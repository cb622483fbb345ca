#!/usr/bin/env bash
# bench/cut-memory.sh LABEL SERIES TICKS [GOMEMLIMIT]: what the 2 h head cut costs in memory (bench/RESULTS.md,
# "The cut's peak, taken apart"): a fresh receiver given SERIES series x TICKS ticks back to back from 02:00 UTC
# today, then one tick at wall time (the cut); prints RSS, heap and VmHWM before and after, and the maxima of
# RssAnon (Go's heap and buffers) and RssFile (mapped block and head-chunk files: page cache) over the cut.
# Binaries from BIN (default bin/: go build -o bin/ ./cmd/gpustore ./bench/cmd/scalebench), data under WORK.
set -euo pipefail
label=$1 series=$2 ticks=$3 limit=${4:-}
B=${BIN:-bin}; W=${WORK:-/tmp/cut-memory}/$label; rm -rf "$W"; mkdir -p "$W"
port=$((19800 + RANDOM % 100)); url=http://127.0.0.1:$port
if [ -n "$limit" ]; then export GOMEMLIMIT=$limit; else unset GOMEMLIMIT; fi
$B/gpustore -target=ingest,query,compact -web.listen-address=127.0.0.1:$port -storage.tsdb.path=$W/data > $W/gpustore.log 2>&1 &
pid=$!; unset GOMEMLIMIT
for i in $(seq 100); do curl -sf $url/-/ready >/dev/null && break; sleep 0.5; done
m() { curl -s $url/metrics | grep -E "^($1)( |\{)" | head -20; }
snap() { echo "-- $1 $(date +%T): VmRSS $(grep VmRSS /proc/$pid/status | awk '{print $2}') kB, VmHWM $(grep VmHWM /proc/$pid/status | awk '{print $2}') kB"; m 'go_memstats_heap_inuse_bytes|gpustore_tsdb_head_series|process_cpu_seconds_total|go_gc_cycles_total_gc_cycles_total|prometheus_tsdb_compaction_duration_seconds_sum|prometheus_tsdb_compactions_total|prometheus_tsdb_head_gc_duration_seconds_sum|go_gc_gomemlimit_bytes'; }
start=$(date -u +%Y-%m-%dT02:00:00Z)
$B/scalebench -url=$url -steps=$series -warm=0 -measure=$((ticks-1)) -paced=false -start=$start -pid=$pid > $W/scale.log 2>&1
snap "after $ticks ticks"
# RssAnon (Go's heap, stacks, off-heap buffers) and RssFile (mapped block and head-chunk files: page cache, reclaimable) apart, every 0.1 s.
( ma=0 mf=0; while kill -0 $pid 2>/dev/null; do read a f < <(awk '/^RssAnon/{a=$2} /^RssFile/{f=$2} END{print a, f}' /proc/$pid/status 2>/dev/null || echo "0 0")
  [ "${a:-0}" -gt $ma ] && ma=$a; [ "${f:-0}" -gt $mf ] && mf=$f; echo "$ma $mf" > $W/rssmax; sleep 0.1; done ) &
sleep 1; echo "-- before the cut: max RssAnon/RssFile so far (kB): $(cat $W/rssmax)"
c0=$(curl -s $url/metrics | awk '/^prometheus_tsdb_compactions_total[{]tenant="default"/{print $2}')
$B/scalebench -url=$url -steps=$series -once -pid=$pid >> $W/scale.log 2>&1
for i in $(seq 600); do
  c=$(curl -s $url/metrics | awk '/^prometheus_tsdb_compactions_total[{]tenant="default"/{print $2}')
  [ -n "$c" ] && [ "$c" != "$c0" ] && break; sleep 1; done
sleep 20
snap "after the cut"
echo "-- max RssAnon / RssFile over the run, cut included (kB): $(cat $W/rssmax)"
kill $pid; wait $pid 2>/dev/null || true
