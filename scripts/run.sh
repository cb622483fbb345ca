#!/usr/bin/env bash
# Starts gpustore on the embedded default and a simulated GPU cluster that
# remote-writes to it in real time. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
NODES=${NODES:-16}
./bin/gpustore --storage.tsdb.path=./data --web.listen-address=:9201 "$@" &
gs=$!
trap 'kill $gs $sim 2>/dev/null; wait' INT TERM EXIT
for _ in $(seq 1 100); do curl -sf localhost:9201/-/ready >/dev/null && break; sleep 0.2; done
# A small fault schedule (scripts/run-faults.yaml) so the GPU rule pack fires
# within minutes; FAULTS= runs a healthy cluster.
FAULTS=${FAULTS-scripts/run-faults.yaml}
./bin/gpusim write --remote-write.url=http://127.0.0.1:9201/api/v1/write \
  --cluster.nodes="$NODES" --replicas=2 --scrape.interval=15s --log.progress-interval=1m \
  ${FAULTS:+--faults.file="$FAULTS"} &
sim=$!
echo "gpustore on http://localhost:9201 (query API /api/v1, metrics /metrics) fed by a ${NODES}-node simulated cluster"
[ -n "$FAULTS" ] && echo "faults from $FAULTS: alerts at http://localhost:9201/api/v1/alerts within a few minutes"
wait $gs
