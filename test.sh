#!/usr/bin/env bash
# The tests of every module of the repository: the library (with the CLI and
# netlock/goredis), the chaos harness (chaos/, a module of its own so that
# toxiproxy stays out of the library's go.mod), the SQL fencing example
# (examples/fencesql, on an embedded SQLite), the OpenTelemetry adapter
# (otelnetlock/) and the benchmark harness (bench/). Flags go to go test:
# ./test.sh -race, ./test.sh -run TestChaos.
set -euo pipefail
cd "$(dirname "$0")"
# The root package runs about 10 minutes with -race on 2 cores: go test's
# default timeout (10m) would cut it; a -timeout among the flags wins.
# Each module is tested as its own go.mod says, as its users get it, not
# with the versions the workspace (go.work) picks across all four (go-redis
# v9.23.0 of chaos/ and bench/ in place of the library's v9.17.3, say).
export GOWORK=off
for m in . chaos examples/fencesql otelnetlock bench; do
	echo "== go test $* ./... in $m"
	(cd "$m" && go test -timeout 30m "$@" ./...)
done
