module github.com/netlock-go/netlock

go 1.25.0

require (
	github.com/alicebob/miniredis/v2 v2.40.0
	github.com/gomodule/redigo v1.9.3
	github.com/redis/go-redis/v9 v9.17.3
	github.com/redis/rueidis v1.0.79
	go.uber.org/goleak v1.3.0
	golang.org/x/term v0.36.0
	pgregory.net/rapid v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dgryski/go-rendezvous v0.0.0-20200823014737-9f7001d12a5f // indirect
	github.com/yuin/gopher-lua v1.1.1 // indirect
	golang.org/x/sys v0.47.0 // indirect
)
