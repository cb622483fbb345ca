#!/usr/bin/env bash
# Starts gpustore on the embedded default and a simulated GPU cluster that
# remote-writes to it in real time. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
NODES=${NODES:-16}
# Loopback only unless asked: gpustore runs here without a web config, so
# every route is open (pprof, /-/reload, every tenant's data).
# LISTEN_ADDRESS=0.0.0.0:9201 (make run LISTEN_ADDRESS=...) opens it to the
# network.
LISTEN_ADDRESS=${LISTEN_ADDRESS:-127.0.0.1:9201}
host=${LISTEN_ADDRESS%:*}
case $host in "" | 0.0.0.0 | "[::]") host=127.0.0.1 ;; esac
url=http://$host:${LISTEN_ADDRESS##*:}
./bin/gpustore --storage.tsdb.path=./data --web.listen-address="$LISTEN_ADDRESS" "$@" &
gs=$!
trap 'kill $gs ${sim:-} 2>/dev/null; wait' INT TERM EXIT
for _ in $(seq 1 100); do
  curl -sf "$url/-/ready" >/dev/null && break
  kill -0 $gs 2>/dev/null || { echo "gpustore exited before it was ready: see its log above" >&2; exit 1; }
  sleep 0.2
done
# A small fault schedule (scripts/run-faults.yaml) so the GPU rule pack fires
# within minutes; FAULTS= runs a healthy cluster.
FAULTS=${FAULTS-scripts/run-faults.yaml}
./bin/gpusim write --remote-write.url="$url/api/v1/write" \
  --cluster.nodes="$NODES" --replicas=2 --scrape.interval=15s --log.progress-interval=1m \
  ${FAULTS:+--faults.file="$FAULTS"} &
sim=$!
echo "gpustore on $url (query API /api/v1, metrics /metrics; listening on $LISTEN_ADDRESS) fed by a ${NODES}-node simulated cluster"
[ -n "$FAULTS" ] && echo "faults from $FAULTS: alerts at $url/api/v1/alerts within a few minutes"
wait $gs
