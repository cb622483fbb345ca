#!/bin/bash
# cluster-day.sh [SYSTEMS]
#
# What holding a 1024-GPU cluster costs a day (issue 33, part 4): CPU cores,
# memory and disk, measured for each of SYSTEMS (default "gpustore ring
# prometheus victoriametrics") on the same load, one system after another,
# each with fresh data directories:
#
#   gpustore         one process, -target=ingest,query,compact, embedded bucket
#   ring             3 receivers (-target=ingest) at RF 3 behind one
#                    distributor,query front, one shared folder bucket
#   prometheus       --web.enable-remote-write-receiver; no HA dedup: it
#                    stores both replicas (as a pair of Prometheus servers would)
#   victoriametrics  single node with its HA settings: __replica__ dropped
#                    (-relabelConfig) and -dedup.minScrapeInterval=15s
#
# Two phases per system:
#   1. real time: gpusim's default cluster (NODES=128 HGX nodes of 8 GPUs and
#      224 CPUs, job churn) as a Prometheus HA pair (two replicas, 15 s, remote
#      write 1.0) for WARMUP+MEASURE seconds; the system's CPU time (every
#      process it has, /proc utime+stime) over the last MEASURE seconds is the
#      steady CPU; RSS sampled every 5 s over the same seconds (VmRSS summed
#      over its processes), and the peak (VmHWM, summed) since start.
#   2. bytes per stored sample: a fresh instance gets DISK_HISTORY (5h: one
#      whole 2 h block whatever the hour) of DISK_NODES (8) nodes of the same cluster, one replica, as fast as it
#      takes them, until a 2 h block is cut (gpustore: shipped to the bucket;
#      Prometheus: in its data directory); bytes/sample is that block's
#      allocated bytes over its meta.json numSamples. VictoriaMetrics: its whole
#      data directory after /internal/force_flush and idle, over the samples
#      written (its merges go on for days, so this errs high). Then the RSS
#      of a head holding those hours (real time holds only minutes) and the
#      series it holds: the memory of a day is this RSS per series times the
#      cluster's series. Skipped for the ring: its receivers write the same
#      blocks as the single node, RF times. PHASES ("realtime disk") picks.
#
# A day is derived, not run: CPU-core-seconds a day = steady cores × 86,400;
# disk a day = samples stored a second (the pair's rate; half of it where HA
# replicas are deduplicated) × 86,400 × bytes per stored sample.
set -euo pipefail
systems=${1:-"gpustore ring prometheus victoriametrics"}
NODES=${NODES:-128}
WARMUP=${WARMUP:-60}
MEASURE=${MEASURE:-180}
DISK_NODES=${DISK_NODES:-8}
DISK_HISTORY=${DISK_HISTORY:-5h}
tools=${GPUSTORE_TOOLS_DIR:-$HOME/.cache/gpustore-tools/bin}
root=$(cd "$(dirname "$0")/.." && pwd)
for sys in $systems; do
	case $sys in
	prometheus | victoriametrics)
		bin=$tools/$sys
		[ "$sys" = victoriametrics ] && bin=$tools/victoria-metrics
		[ -x "$bin" ] || { echo "$bin is missing: make tools (Prometheus), make bench-compare (VictoriaMetrics)" >&2; exit 2; } ;;
	esac
done
work=${WORK:-$(mktemp -d)}
GOFLAGS=-tags=dedupelabels go build -o "$work/" "$root/cmd/gpustore" "$root/bench/cmd/gpusim"
pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait "${pids[@]}" 2>/dev/null || true; pids=(); }
trap 'stop; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
hz=$(getconf CLK_TCK)
cpu() { local t=0 p; for p in "${pids[@]}"; do t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo "$t"; }
kib() { local t=0 p; for p in "${pids[@]}"; do t=$((t + $(awk -v k="$1:" '$1 == k {print $2}' /proc/$p/status))); done; echo "$t"; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
front=127.0.0.1:19610

# start SYSTEM DIR: starts the system's processes (pids) on $front.
start() {
	local sys=$1 dir=$2
	mkdir -p "$dir"
	case $sys in
	gpustore)
		"$work/gpustore" -target=ingest,query,compact -log.level=warn -web.listen-address=$front \
			-storage.tsdb.path="$dir/data" >"$dir/log" 2>&1 &
		pids+=($!) ;;
	ring)
		mkdir -p "$dir/bucket"
		printf 'type: FILESYSTEM\nconfig:\n  directory: %s/bucket\n' "$dir" >"$dir/bucket.yml"
		local common=(-objstore.config-file="$dir/bucket.yml" -log.level=warn -ring.enabled -ring.replication-factor=3
			-memberlist.bind-addr=127.0.0.1 -memberlist.join=127.0.0.1:18661)
		for i in 1 2 3; do
			"$work/gpustore" -target=ingest "${common[@]}" -ring.instance-id=r$i -memberlist.nodename=r$i \
				-memberlist.bind-port=1866$i -web.listen-address=127.0.0.1:1961$i -storage.tsdb.path="$dir/r$i" >"$dir/r$i.log" 2>&1 &
			pids+=($!)
		done
		"$work/gpustore" -target=distributor,query "${common[@]}" -ring.instance-id=front -memberlist.nodename=front \
			-memberlist.bind-port=18660 -web.listen-address=$front -storage.tsdb.path="$dir/front" >"$dir/front.log" 2>&1 &
		pids+=($!) ;;
	prometheus)
		printf 'global:\n  scrape_interval: 15s\n' >"$dir/prometheus.yml"
		"$tools/prometheus" --config.file="$dir/prometheus.yml" --web.enable-remote-write-receiver \
			--storage.tsdb.path="$dir/data" --web.listen-address=$front >"$dir/log" 2>&1 &
		pids+=($!) ;;
	victoriametrics)
		printf -- '- action: labeldrop\n  regex: __replica__\n' >"$dir/relabel.yml"
		"$tools/victoria-metrics" -storageDataPath="$dir/data" -httpListenAddr=$front -search.latencyOffset=0s \
			-relabelConfig="$dir/relabel.yml" -dedup.minScrapeInterval=15s >"$dir/log" 2>&1 &
		pids+=($!) ;;
	*) echo "unknown system $sys" >&2; exit 2 ;;
	esac
	local ready=/-/ready
	[ "$sys" = victoriametrics ] && ready=/health
	until curl -sf "http://$front$ready" >/dev/null; do sleep 0.5; done
	if [ "$sys" = ring ]; then
		until [ "$(curl -s "http://$front/ring" | grep -o ACTIVE | wc -l)" -ge 3 ]; do sleep 0.5; done
	fi
}

# realtime SYSTEM: phase 1; prints one line of figures.
realtime() {
	local sys=$1 dir=$work/$1-rt
	start "$sys" "$dir"
	local l0; l0=$(load)
	"$work/gpusim" write --cluster.nodes="$NODES" --replicas=2 --remote-write.shards=4 \
		--remote-write.url="http://$front/api/v1/write" --log.level=info --log.progress-interval=60s >"$dir/gpusim.log" 2>&1 &
	local sim=$!
	sleep "$WARMUP"
	local c0 t0 n=0 sum=0 r
	c0=$(cpu) t0=$(date +%s.%N)
	for _ in $(seq 1 $((MEASURE / 5))); do
		sleep 5
		r=$(kib VmRSS) sum=$((sum + r)) n=$((n + 1))
	done
	local c1 t1 hwm simcpu
	c1=$(cpu) t1=$(date +%s.%N) hwm=$(kib VmHWM)
	simcpu=$(awk '{print $14+$15}' /proc/$sim/stat)
	kill -INT $sim; wait $sim || true
	local done; done=$(grep -o 'done.*' "$dir/gpusim.log" | tail -1)
	local rate skipped
	rate=$(sed -n 's/.* samples_per_sec=\([0-9]*\).*/\1/p' <<<"$done")
	skipped=$(sed -n 's/.*skipped_ticks=\([0-9]*\).*/\1/p' <<<"$done")
	# RSS before the series count below, whose query grows the heap.
	local rss_end; rss_end=$(kib VmRSS)
	local series=""
	series=$(curl -s "http://$front/api/v1/query" --data-urlencode 'query=count({__name__=~".+"})' | grep -o '"[0-9]*"\]' | tr -dc '0-9' || true)
	stop
	local disk; disk=$(du -sb --exclude=bucket "$dir" | cut -f1)
	awk -v sys="$sys" -v c0="$c0" -v c1="$c1" -v t0="$t0" -v t1="$t1" -v hz="$hz" -v rss="$((sum / n))" -v rss_end="$rss_end" \
		-v hwm="$hwm" -v rate="$rate" -v skipped="$skipped" -v series="$series" -v disk="$disk" \
		-v simcpu="$simcpu" -v l0="$l0" -v l1="$(load)" 'BEGIN {
		cores = (c1 - c0) / hz / (t1 - t0)
		printf "%s real time: %.0f samples/s sent by the pair (%d skipped ticks), %s series queried; CPU %.3f cores = %.0f core-s/day; RSS mean %.0f MiB, end %.0f MiB, peak %.0f MiB; local disk at the end %.1f MiB; gpusim CPU %.1f s; load %s -> %s\n",
			sys, rate, skipped, series, cores, cores * 86400, rss / 1024, rss_end / 1024, hwm / 1024, disk / 2^20, simcpu / hz, l0, l1
	}'
}

# blockbytes SYSTEM: phase 2; prints bytes per stored sample.
blockbytes() {
	local sys=$1 dir=$work/$1-disk
	start "$sys" "$dir"
	local l0; l0=$(load)
	"$work/gpusim" backfill --cluster.nodes="$DISK_NODES" --backfill.duration="$DISK_HISTORY" --remote-write.shards=2 \
		--remote-write.url="http://$front/api/v1/write" --log.level=info --log.progress-interval=60s >"$dir/gpusim.log" 2>&1
	local samples; samples=$(grep -o 'done.*' "$dir/gpusim.log" | sed -n 's/.* samples=\([0-9]*\).*/\1/p')
	local where=$dir/data
	[ "$sys" = gpustore ] && where=$dir/data/bucket
	local largest="" rss hwm series
	if [ "$sys" = victoriametrics ]; then
		curl -sf "http://$front/internal/force_flush" >/dev/null
		sleep 20
		rss=$(kib VmRSS) hwm=$(kib VmHWM)
		series=$(curl -s "http://$front/api/v1/query" --data-urlencode 'query=count({__name__=~".+"})' | grep -o '"[0-9]*"\]' | tr -dc '0-9' || true)
		stop
		largest="$(du -sb "$dir/data" | cut -f1) $samples"
	else
		# The first whole 2 h block (gpustore ships it to its bucket).
		for _ in $(seq 1 90); do
			[ -n "$(find "$where" -name meta.json -path '*/01*' 2>/dev/null)" ] && break
			sleep 2
		done
		sleep 5
		largest=$(for m in $(find "$where" -name meta.json -path '*/01*'); do
			echo "$(du -sb "$(dirname "$m")" | cut -f1) $(grep -o '"numSamples": *[0-9]*' "$m" | tr -dc '0-9')"
		done | sort -n | tail -1)
		rss=$(kib VmRSS) hwm=$(kib VmHWM)
		series=$(curl -s "http://$front/api/v1/query" --data-urlencode 'query=count({__name__=~".+"})' | grep -o '"[0-9]*"\]' | tr -dc '0-9' || true)
		stop
	fi
	# The RSS of a head that holds hours of the series (real time holds
	# minutes): for a day's memory, scaled by the cluster's series.
	awk -v sys="$sys" -v l="$largest" -v rss="$rss" -v hwm="$hwm" -v series="$series" -v l0="$l0" -v l1="$(load)" 'BEGIN {
		split(l, a, " ")
		printf "%s bytes per stored sample: %.3f (%.1f MiB, %d samples); after the history: RSS %.0f MiB, peak %.0f MiB, %s series queried; load %s -> %s\n", sys, a[1] / a[2], a[1] / 2^20, a[2], rss / 1024, hwm / 1024, series, l0, l1
	}'
}

echo "cluster-day: NODES=$NODES WARMUP=$WARMUP MEASURE=$MEASURE DISK_NODES=$DISK_NODES DISK_HISTORY=$DISK_HISTORY at $(git -C "$root" rev-parse --short HEAD), $(date -u)"
for sys in $systems; do
	[[ "${PHASES:-realtime disk}" != *realtime* ]] || realtime "$sys"
	[[ "${PHASES:-realtime disk}" != *disk* || "$sys" = ring ]] || blockbytes "$sys"
done
