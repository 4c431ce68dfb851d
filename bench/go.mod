module github.com/netlock-go/netlock/bench

go 1.26.0

// Inside the repository this module builds against the library checked
// out next to it: through ../go.work, and through this replace when the
// workspace is off (GOWORK=off). A module that requires this one ignores
// the replace and gets at least the netlock version required below.
replace github.com/netlock-go/netlock => ../

require (
	github.com/bsm/redislock v0.9.4
	github.com/go-redsync/redsync/v4 v4.18.1
	github.com/gomodule/redigo v1.9.3
	github.com/netlock-go/netlock v0.0.0-20261124022100-c5f098386197
	github.com/redis/go-redis/v9 v9.23.0
	github.com/redis/rueidis v1.0.79
	github.com/redis/rueidis/rueidiscompat v1.0.79
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

// redsync's rueidis adapter needs rueidiscompat; the module proxy serves it
// only at v1.0.69, which builds against rueidis v1.0.79.
replace github.com/redis/rueidis/rueidiscompat => github.com/redis/rueidis/rueidiscompat v1.0.69
