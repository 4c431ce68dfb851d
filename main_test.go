package netlock

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// go-redis redials a server that refused it on a goroutine that sleeps
	// a second between tries and ends at the first after its client was
	// closed: a test whose server was killed last may end before it does.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}
