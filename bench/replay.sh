#!/usr/bin/env bash
# bench/replay.sh: what a receiver's restart costs (bench/RESULTS.md, "WAL replay taken apart", issue 41 item 1).
#
#   bench/replay.sh feed LABEL SCALEBENCH-ARGS...   a fresh receiver fed by scalebench, left IDLE seconds (the TSDB
#                                                    m-maps full head chunks once a minute: 75 makes a back-to-back
#                                                    feed's head look like one fed in real time), then kill -9; its
#                                                    data directory is kept as WORK/LABEL/killed
#   bench/replay.sh kill LABEL RUN [FLAGS...]       restart on a copy of that directory: the WAL replay after kill -9
#   bench/replay.sh graceful LABEL RUN [FLAGS...]   start on a copy, SIGTERM once ready (the clean stop), restart
#
# A restart prints seconds to /-/ready, prometheus_tsdb_data_replay_duration_seconds, the CPU seconds the process
# used until ready (utime + stime), its RSS and VmHWM then, and the load average before it. PROF=SECONDS also writes
# a CPU profile of the replay (from /debug/pprof, which the server answers before ready) to WORK/LABEL/RUN.pprof.
# RECOVERED=1 (with -storage.tsdb.recover-wal-aside=on) then waits until the set-aside head is recovered into blocks
# and prints that time, the CPU seconds and VmHWM then; FEED="SCALEBENCH-ARGS" sends a write meanwhile (e.g. "-steps=N
# -once": every series of the new head). Binaries from BIN (default bin/: go build -o bin/ ./cmd/gpustore ./bench/cmd/scalebench), data under WORK.
set -euo pipefail
cmd=$1 label=$2; shift 2
B=${BIN:-bin}; W=${WORK:-/tmp/replay}/$label; port=${PORT:-19730}; url=http://127.0.0.1:$port
start() { # start DATA LOG FLAGS...: gpustore in the background, its pid in $pid
	local data=$1 log=$2; shift 2
	$B/gpustore -target=ingest,query,compact -web.listen-address=127.0.0.1:$port -storage.tsdb.path="$data" "$@" > "$log" 2>&1 &
	pid=$!
}
restart() { # restart RUN FLAGS...: time a start on $W/data to ready, then kill -9 it
	local run=$1; shift
	local load; load=$(cut -d' ' -f1-3 /proc/loadavg)
	local t0; t0=$(date +%s.%N)
	start "$W/data" "$W/$run.log" "$@"
	until curl -sf $url/metrics > /dev/null; do sleep 0.05; done
	local prof=
	if [ -n "${PROF:-}" ]; then curl -s -o "$W/$run.pprof" "$url/debug/pprof/profile?seconds=$PROF" & prof=$!; fi
	until curl -sf $url/-/ready > /dev/null; do sleep 0.1; done
	local t1; t1=$(date +%s.%N)
	local cpu; cpu=$(awk -v hz="$(getconf CLK_TCK)" '{printf "%.1f", ($14 + $15) / hz}' /proc/$pid/stat)
	local rss hwm; rss=$(awk '/^VmRSS/{printf "%.0f", $2/1024}' /proc/$pid/status); hwm=$(awk '/^VmHWM/{printf "%.0f", $2/1024}' /proc/$pid/status)
	local replay; replay=$(curl -s $url/metrics | awk '/^prometheus_tsdb_data_replay_duration_seconds/{printf "%.1f", $2}')
	local rec=
	if [ -n "${RECOVERED:-}" ]; then # with -storage.tsdb.recover-wal-aside=on: until the set-aside head is in blocks
		[ -z "${FEED:-}" ] || $B/scalebench -url=$url $FEED > "$W/$run.feed.out" 2>&1
		until curl -s $url/metrics | grep -q '^gpustore_tsdb_head_recoveries_pending 0'; do sleep 0.2; done
		local t2; t2=$(date +%s.%N)
		rec=$(awk -v hz="$(getconf CLK_TCK)" -v t="$(echo "$t2 - $t0" | bc)" '{printf ", recovered %.1f s, CPU %.1f s", t, ($14 + $15) / hz}' /proc/$pid/stat)
		rec="$rec, VmHWM $(awk '/^VmHWM/{printf "%.0f", $2/1024}' /proc/$pid/status) MiB"
	fi
	[ -z "$prof" ] || wait $prof
	kill -9 $pid; wait $pid 2> /dev/null || true
	echo "$label $run: ready $(echo "$t1 - $t0" | bc | xargs printf '%.1f') s, replay $replay s, CPU $cpu s, RSS $rss MiB, VmHWM $hwm MiB$rec, load $load"
}
case $cmd in
feed)
	rm -rf "$W"; mkdir -p "$W"
	start "$W/data" "$W/feed.log"
	until curl -sf $url/-/ready > /dev/null; do sleep 0.2; done
	$B/scalebench -url=$url -pid=$pid "$@" > "$W/scalebench.out" 2> "$W/scalebench.err"
	curl -s $url/metrics | grep -E '^prometheus_tsdb_head_(series|samples_appended_total)\{' || true
	sleep "${IDLE:-75}"
	kill -9 $pid; wait $pid 2> /dev/null || true
	du -sm "$W"/data/tenants/*/wal "$W"/data/tenants/*/chunks_head
	mv "$W/data" "$W/killed"
	;;
kill)
	run=$1; shift
	rm -rf "$W/data"; cp -a "$W/killed" "$W/data"; sync
	restart "$run" "$@"
	;;
graceful)
	run=$1; shift
	rm -rf "$W/data"; cp -a "$W/killed" "$W/data"; sync
	start "$W/data" "$W/$run.first.log" "$@"
	until curl -sf $url/-/ready > /dev/null; do sleep 0.1; done
	s0=$(date +%s.%N); kill -TERM $pid; while kill -0 $pid 2> /dev/null; do sleep 0.05; done; s1=$(date +%s.%N)
	snap=$( (du -sm "$W"/data/tenants/*/chunk_snapshot.* 2> /dev/null || true) | awk '{s += $1} END {print s + 0}')
	echo "$label $run: clean stop $(echo "$s1 - $s0" | bc | xargs printf '%.1f') s, chunk snapshot $snap MB"
	restart "$run" "$@"
	;;
*) echo "usage: $0 feed|kill|graceful LABEL ..." >&2; exit 2 ;;
esac
