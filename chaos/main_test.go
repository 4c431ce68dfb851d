package chaos

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/netlock-go/netlock/chaos/internal/toxi"
)

func TestMain(m *testing.M) {
	// toxiproxy (the tests' network) leaks goroutines of its own when a
	// server dies under it; see toxi.Leaks.
	var opts []goleak.Option
	for _, fn := range toxi.Leaks {
		opts = append(opts, goleak.IgnoreAnyFunction(fn))
	}
	goleak.VerifyTestMain(m, opts...)
}
