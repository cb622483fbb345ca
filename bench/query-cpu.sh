#!/bin/bash
# query-cpu.sh BINARY DATA_DIR PORT WINDOW END [ROUNDS]
#
# Receiver CPU per dashboard query, less sensitive to a shared machine's
# load than latency: starts BINARY (ingest,query; results cache and day
# splitting off) on a copy of DATA_DIR (e.g. a bench-compare -keep run's
# gpustore/backfill/data), warms it with one round, then runs ROUNDS rounds
# of bench/load's 22 dashboard panels over WINDOW ending at END and prints
# the latency line and the process' utime+stime per query.
set -euo pipefail
bin=$1 data=$2 port=$3 win=$4 end=$5 rounds=${6:-10}
work=$(mktemp -d)
trap 'kill $pid 2>/dev/null; rm -rf "$work"' EXIT
cp -a "$data" "$work/data"
"$bin" -query.results-cache.enabled=false -query.split-by-day=false -web.listen-address=127.0.0.1:"$port" \
	-storage.tsdb.path="$work/data" -target=ingest,query >"$work/gpustore.log" 2>&1 &
pid=$!
until curl -sf "http://127.0.0.1:$port/-/ready" >/dev/null; do sleep 0.5; done
loadgen=$(dirname "$0")/../bin/loadgen
q() { "$loadgen" query -url "http://127.0.0.1:$port" -end "$end" -windows "$win" -scrape.interval 1m -warmup 0 -rounds "$1"; }
q 1 >/dev/null 2>&1
t0=$(awk '{print $14+$15}' /proc/$pid/stat)
q "$rounds" 2>&1 | tail -1
t1=$(awk '{print $14+$15}' /proc/$pid/stat)
ticks=$(getconf CLK_TCK)
echo "$win: $(( (t1 - t0) * 1000 / ticks / (rounds * 22) )) ms receiver CPU per query ($bin)"
