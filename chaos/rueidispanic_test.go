package chaos

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/netlock-go/netlock/internal/redistest"
)

// rueidisPanics are the faults left out of runFaults' rotation unless
// NETLOCK_CHAOS_ALL=1 (allFaultsEnv), or no client is a rueidis one
// (clientsEnv): while they last, rueidis panics when it unsubscribes (see
// TestRueidisUnsubscribeRefused), which ends the test process whatever
// netlock does.
var rueidisPanics = []string{"busy", "misconf"}

// allFaultsEnv, set to 1, puts every fault of refusalKinds in runFaults'
// rotation, rueidisPanics included.
const allFaultsEnv = "NETLOCK_CHAOS_ALL"

// childEnv names, in the child process of TestRueidisUnsubscribeRefused,
// the fault under which it unsubscribes.
const childEnv = "NETLOCK_CHAOS_RUEIDIS_CHILD"

// TestRueidisUnsubscribeRefused holds why rueidisPanics are out of the
// chaos tests' rotation: rueidis (v1.0.79, and v1.0.80 alike) panics with
// "protocol bug, message handled out of order", in its connection's
// reading goroutine, when it unsubscribes on a RESP3 connection while the
// server refuses a command it sends: a BUSY server (a script of another
// client runs past busy-reply-threshold) refuses the UNSUBSCRIBE, one that
// failed to save (MISCONF) the PING rueidis sends after it. netlock's
// rueidis Backend unsubscribes so when a wait ends. The panic ends the
// process: each case runs in a child process, and the test fails once a
// child no longer panics, for the fault to go back in the rotation.
func TestRueidisUnsubscribeRefused(t *testing.T) {
	if kind := os.Getenv(childEnv); kind != "" {
		unsubscribeRefused(t, kind)
		return
	}
	redistest.Require(t)
	for _, kind := range rueidisPanics {
		t.Run(kind, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestRueidisUnsubscribeRefused$", "-test.v")
			cmd.Env = append(os.Environ(), childEnv+"="+kind)
			out, err := cmd.CombinedOutput()
			const panicked = "panic: protocol bug, message handled out of order"
			if err == nil || !strings.Contains(string(out), panicked) {
				t.Errorf("the child: %v, output:\n%s\nwant the panic %q: if rueidis no longer panics, run the chaos tests with %s=1; if they pass, put %s back in the rotation (faultKinds)",
					err, out, panicked, allFaultsEnv, kind)
			}
		})
	}
}

// unsubscribeRefused subscribes a rueidis client, starts a fault of kind
// (busy or misconf) on the server, and unsubscribes meanwhile.
func unsubscribeRefused(t *testing.T, kind string) {
	if !slices.Contains(rueidisPanics, kind) {
		t.Fatalf("%s=%q: want one of %q", childEnv, kind, rueidisPanics)
	}
	s := redistest.Start(t, serverArgs...)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	received := make(chan error, 1)
	go func() {
		received <- c.Receive(ctx, c.B().Subscribe().Channel("chaos").Build(), func(rueidis.PubSubMessage) {})
	}()
	time.Sleep(200 * time.Millisecond) // subscribed
	faulted := make(chan struct{})
	go func() {
		defer close(faulted)
		refuse(t, kind, []*redistest.Server{s}, 500*time.Millisecond, 0)
	}()
	time.Sleep(200 * time.Millisecond) // busy past its threshold, or the save failed
	t.Logf("UNSUBSCRIBE: %v", c.Do(ctx, c.B().Unsubscribe().Channel("chaos").Build()).Error())
	t.Logf("PING: %v", c.Do(ctx, c.B().Ping().Build()).Error())
	<-faulted
	cancel()
	<-received
}
