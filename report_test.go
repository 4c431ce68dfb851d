package netlock

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// reportEnv names a file to which the property and waiting tests append
// their figures (steps explored, acquisitions, violations, commands per
// waiter-second), one line each, so that CI can print them without running
// every test verbosely. The chaos module's tests (chaos/) append theirs to
// the same file.
const reportEnv = "NETLOCK_REPORT"

var reportMu sync.Mutex

// reportFigures logs a line of figures with t.Logf and appends it to the file named
// by $NETLOCK_REPORT, if set.
func reportFigures(t testing.TB, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	path := os.Getenv(reportEnv)
	if path == "" {
		return
	}
	reportMu.Lock()
	defer reportMu.Unlock()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Errorf("%s: %v", reportEnv, err)
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s: %s\n", t.Name(), line)
}
