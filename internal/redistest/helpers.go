package redistest

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
)

// ReportEnv names a file to which tests append their figures (steps
// explored, acquisitions, violations, commands per waiter-second), one line
// each, so that CI can print them without running every test verbosely.
// Every module of the repository appends to the same file.
const ReportEnv = "NETLOCK_REPORT"

var reportMu sync.Mutex

// Report logs a line of figures with t.Log and appends it, prefixed with
// the test's name, to the file named by $NETLOCK_REPORT, if set.
func Report(t testing.TB, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	path := os.Getenv(ReportEnv)
	if path == "" {
		return
	}
	reportMu.Lock()
	defer reportMu.Unlock()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Errorf("%s: %v", ReportEnv, err)
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s: %s\n", t.Name(), line)
}

// Within fails the test if fn does not return within d: a hang becomes a
// failure instead of a test timeout.
func Within(t testing.TB, d time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		t.Fatalf("%s did not return within %v", what, d)
	}
}
