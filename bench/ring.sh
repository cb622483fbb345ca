#!/bin/bash
# ring.sh [TOPOLOGIES]
#
# Ingest and dashboard-query cost of scale-out on loopback: for each
# topology ("single", or RECEIVERS:RF, e.g. "1:1 3:1 3:3 5:3"), starts
# gpustore (one -target=ingest,query process, or RECEIVERS receivers and one
# distributor,query front on the ring), writes the simulated 32-node cluster
# (DURATION of history at 15 s, default 2h: 6.4 M samples) as fast as it is
# accepted, then runs
# bench/load's dashboard panels over 1 h and 6 h windows (results cache
# off). Prints loadgen's lines, the front's CPU per million samples and the
# CPU of every gpustore process together, and per query window the CPU
# the front and every gpustore process spent per query (warm-up round
# included) with the load average after it. ROUNDS (default 5) and
# WINDOWS (default "1h 6h") change the query phase; PANELS (default "dashboard") names
# the panel sets, run one after the other on the same data: "dashboard" (the
# 22 dashboard panels), "issue42" (issue 42's six panels). GPUSTORE_BIN
# runs a gpustore built elsewhere (an A/B on the same script). RATE (samples/s, default
# as fast as accepted) paces the write: written 100 times faster than real
# time or more, a write acknowledged by a quorum is overtaken on the
# slowest replica by the next one, which that replica stores out of order
# or rejects as too old, so replicas differ far more than under live
# traffic; at 100000 (38x real time) a series' samples arrive 0.4 s apart
# and replicas stay alike. Every process shares this
# machine's cores: compare topologies run here, not absolute throughput.
#
# LOAD=scale (issue 41 item 1: a ring at millions of series) replaces the
# write and the panels with bench/cmd/scalebench driving the front at 15 s,
# one run per step of STEPS (default "500000 1000000 2000000" active series,
# gpusim's HGX cluster repeated, with job churn), and after each step prints
# every receiver's head series, RSS and CPU cores over the step beside the
# front's.
set -euo pipefail
topologies=${1:-"single 1:1 3:1 3:3 5:3"}
rounds=${ROUNDS:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
if [ -n "${GPUSTORE_BIN:-}" ]; then
	cp "$GPUSTORE_BIN" "$work/gpustore"
else
	go build -tags dedupelabels -o "$work/gpustore" "$root/cmd/gpustore"
fi
panelsets=${PANELS:-dashboard}
npanels() { case $1 in dashboard) echo 22 ;; issue42) echo 6 ;; *) echo "PANELS: dashboard or issue42" >&2; exit 2 ;; esac; }
for ps in $panelsets; do npanels "$ps" >/dev/null; done
go build -o "$work/loadgen" "$root/bench/cmd/loadgen"
go build -o "$work/scalebench" "$root/bench/cmd/scalebench"
pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }
trap 'stop; rm -rf "$work"' EXIT
cpu() { # utime+stime of the processes given (default: every process started), in seconds
	local t=0 p
	for p in "${@:-${pids[@]}}"; do t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done
	echo "scale=2; $t/$(getconf CLK_TCK)" | bc
}
front=127.0.0.1:19510
rss() { awk '/^VmRSS/ {printf "%.0f MiB", $2/1024}' /proc/"$1"/status; }
head_series() { curl -s "http://$1/metrics" | awk '/^prometheus_tsdb_head_series[{ ]/ {n += $NF} END {printf "%d", n}'; }
# scale_steps: scalebench at each step, then every process's figures.
scale_steps() {
	local step p i t0 c0 cs
	for step in ${STEPS:-500000 1000000 2000000}; do
		t0=$(date +%s.%N) cs=()
		for p in "${pids[@]}"; do cs+=("$(cpu "$p")"); done
		"$work/scalebench" -url "http://$front" -steps "$step" | tail -1
		i=0
		for p in "${pids[@]}"; do
			c0=${cs[$i]} i=$((i + 1))
			local addr=$front
			[ "$p" != "${pids[-1]}" ] && addr=127.0.0.1:1951$i
			echo "  $([ "$p" = "${pids[-1]}" ] && echo front || echo r$i): head series $(head_series "$addr"), RSS $(rss "$p")," \
				"$(echo "scale=3; ($(cpu "$p") - $c0)/($(date +%s.%N) - $t0)" | bc) cores"
		done
		echo "  load average $(cut -d' ' -f1-3 /proc/loadavg)"
	done
}
for topo in $topologies; do
	run=$work/$topo
	mkdir -p "$run/bucket"
	printf 'type: FILESYSTEM\nconfig:\n  directory: %s/bucket\n' "$run" >"$run/bucket.yml"
	common=(-objstore.config-file="$run/bucket.yml" -query.results-cache.enabled=false -log.level=warn)
	if [ "$topo" = single ]; then
		"$work/gpustore" -target=ingest,query "${common[@]}" -web.listen-address=$front -storage.tsdb.path="$run/s" >"$run/s.log" 2>&1 &
		pids+=($!)
	else
		n=${topo%:*} rf=${topo#*:}
		ring=(-ring.enabled -ring.replication-factor="$rf" -memberlist.bind-addr=127.0.0.1 -memberlist.join=127.0.0.1:18561)
		for i in $(seq 1 "$n"); do
			"$work/gpustore" -target=ingest "${common[@]}" "${ring[@]}" -ring.instance-id=r$i -memberlist.nodename=r$i \
				-memberlist.bind-port=1856$i -web.listen-address=127.0.0.1:1951$i -storage.tsdb.path="$run/r$i" >"$run/r$i.log" 2>&1 &
			pids+=($!)
		done
		"$work/gpustore" -target=distributor,query "${common[@]}" "${ring[@]}" -ring.instance-id=front -memberlist.nodename=front \
			-memberlist.bind-port=18560 -web.listen-address=$front -storage.tsdb.path="$run/front" >"$run/front.log" 2>&1 &
		pids+=($!)
	fi
	until curl -sf "http://$front/-/ready" >/dev/null; do sleep 0.5; done
	if [ "$topo" != single ]; then
		until [ "$(curl -s "http://$front/ring" | grep -o ACTIVE | wc -l)" -ge "$n" ]; do sleep 0.5; done
	fi
	echo "== $topo (load average $(cut -d' ' -f1-3 /proc/loadavg))"
	if [ "${LOAD:-}" = scale ]; then
		scale_steps
		stop
		continue
	fi
	c0=$(cpu)
	"$work/loadgen" write -url "http://$front/api/v1/write" -cluster.nodes 32 -duration "${DURATION:-2h}" -end 2026-12-03T18:00:00Z \
		-scrape.interval 15s -rate "${RATE:-0}" -pid "${pids[-1]}" 2>&1 | tail -2
	sleep 3
	echo "every gpustore process: $(echo "$(cpu) - $c0" | bc) CPU-seconds"
	front_pid=${pids[-1]}
	for ps in $panelsets; do
		for w in ${WINDOWS:-1h 6h}; do
			c0=$(cpu) f0=$(cpu "$front_pid")
			echo "-- $ps panels, $w"
			"$work/loadgen" query -url "http://$front" -end 2026-12-03T18:00:00Z -windows "$w" -rounds "$rounds" -panels "$ps" 2>&1 | tail -3
			# Every panel of every round, the warm-up round included, counts.
			n=$(($(npanels "$ps") * (rounds + 1)))
			echo "$w: front $(echo "scale=2; 1000*($(cpu "$front_pid") - $f0)/$n" | bc) CPU-ms/query," \
				"every gpustore process $(echo "scale=2; 1000*($(cpu) - $c0)/$n" | bc) CPU-ms/query; load average $(cut -d' ' -f1-3 /proc/loadavg)"
		done
	done
	stop
done
