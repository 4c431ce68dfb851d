module github.com/netlock-go/netlock/examples/fencesql

go 1.26.0

// A test-only module: the fencing pattern for SQL, run on an embedded
// pure-Go SQLite, so that the library's go.mod stays without a database.
// Inside the repository it builds against the library checked out next to
// it (this replace, or ../../go.work).
replace github.com/netlock-go/netlock => ../../

require (
	github.com/alicebob/miniredis/v2 v2.40.0
	github.com/gomodule/redigo v1.9.3
	github.com/netlock-go/netlock v0.0.0-20261124022100-c5f098386197
	modernc.org/sqlite v1.62.0
)

require (
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/redis/rueidis v1.0.79 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	github.com/yuin/gopher-lua v1.1.1 // indirect
	golang.org/x/sys v0.49.0 // indirect
	modernc.org/libc v1.80.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
)
