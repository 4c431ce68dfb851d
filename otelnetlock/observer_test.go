package otelnetlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/netlock-go/netlock"
)

// telemetry is an Observer recording into an in-memory metric reader and
// span recorder.
type telemetry struct {
	obs    netlock.Observer
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tracer trace.Tracer // of the same provider, for the caller's own spans
}

func newTelemetry(t *testing.T, opts ...Option) *telemetry {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() {
		mp.Shutdown(context.Background())
		tp.Shutdown(context.Background())
	})
	obs, err := NewObserver(append([]Option{WithMeterProvider(mp), WithTracerProvider(tp)}, opts...)...)
	if err != nil {
		t.Fatalf("NewObserver: %v", err)
	}
	return &telemetry{obs: obs, reader: reader, spans: spans, tracer: tp.Tracer("test")}
}

// instruments are the kind and unit of each instrument the package
// documents.
var instruments = map[string]struct {
	unit      string
	histogram bool // a float64 histogram; otherwise a monotonic int64 sum
}{
	"netlock.lock.wait_time":   {"s", true},
	"netlock.lock.hold_time":   {"s", true},
	"netlock.lock.extend_time": {"s", true},
	"netlock.lock.lost_holds":  {"{hold}", false},
	"netlock.lock.errors":      {"{error}", false},
}

// point is one data point: its count (a histogram's) or value (a
// counter's), and a histogram's sum.
type point struct {
	count int64
	sum   float64
}

// metrics collects what the reader holds: for each instrument, each data
// point by its attributes encoded as "key=value,..." in key order. It fails
// the test if an instrument is not of the documented kind and unit.
func (tel *telemetry) metrics(t *testing.T) map[string]map[string]point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tel.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("Collect: %v", err)
	}
	out := map[string]map[string]point{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != ScopeName {
			t.Errorf("instrumentation scope: got %q, want %q", sm.Scope.Name, ScopeName)
		}
		for _, m := range sm.Metrics {
			want, ok := instruments[m.Name]
			if !ok {
				t.Errorf("instrument %q: not documented", m.Name)
				continue
			}
			if m.Unit != want.unit || m.Description == "" {
				t.Errorf("instrument %q: unit %q, description %q; want unit %q and a description", m.Name, m.Unit, m.Description, want.unit)
			}
			points := map[string]point{}
			switch data := m.Data.(type) {
			case metricdata.Histogram[float64]:
				if !want.histogram {
					t.Errorf("instrument %q: got a float64 histogram, want a counter", m.Name)
				}
				for _, p := range data.DataPoints {
					points[encode(p.Attributes)] = point{count: int64(p.Count), sum: p.Sum}
				}
			case metricdata.Sum[int64]:
				if want.histogram || !data.IsMonotonic {
					t.Errorf("instrument %q: got an int64 sum (monotonic %v), want a float64 histogram", m.Name, data.IsMonotonic)
				}
				for _, p := range data.DataPoints {
					points[encode(p.Attributes)] = point{count: p.Value}
				}
			default:
				t.Errorf("instrument %q: got data %T", m.Name, m.Data)
			}
			out[m.Name] = points
		}
	}
	return out
}

// counts returns metrics' counts alone, for comparing with a table.
func counts(metrics map[string]map[string]point) map[string]map[string]int64 {
	out := map[string]map[string]int64{}
	for name, points := range metrics {
		out[name] = map[string]int64{}
		for attrs, p := range points {
			out[name][attrs] = p.count
		}
	}
	return out
}

// checkCounts compares every instrument's data points with want.
func checkCounts(t *testing.T, got, want map[string]map[string]int64) {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(instruments)) {
		if !maps.Equal(got[name], want[name]) {
			t.Errorf("%s: got %s\nwant %s", name, show(got[name]), show(want[name]))
		}
	}
}

func show(points map[string]int64) string {
	if len(points) == 0 {
		return "no points"
	}
	var b strings.Builder
	for _, attrs := range slices.Sorted(maps.Keys(points)) {
		fmt.Fprintf(&b, "\n\t{%s}: %d", attrs, points[attrs])
	}
	return b.String()
}

func encode(s attribute.Set) string { return s.Encoded(attribute.DefaultEncoder()) }

// attrs encodes kvs as metrics does, leaving out netlock.lock.name when it
// is "" (WithMetricLockName left it out).
func attrs(kvs ...attribute.KeyValue) string {
	kvs = slices.DeleteFunc(kvs, func(kv attribute.KeyValue) bool {
		return kv.Key == "netlock.lock.name" && kv.Value.AsString() == ""
	})
	return encode(attribute.NewSet(kvs...))
}

// The attributes of each instrument, written out with the documented keys.

func waitAttrs(name string, try bool, outcome string, contended, handedOver bool, errType string) string {
	kvs := []attribute.KeyValue{
		attribute.String("netlock.lock.name", name),
		attribute.Bool("netlock.acquire.try", try),
		attribute.String("netlock.acquire.outcome", outcome),
		attribute.Bool("netlock.acquire.contended", contended),
		attribute.Bool("netlock.acquire.handed_over", handedOver),
	}
	if errType != "" {
		kvs = append(kvs, attribute.String("error.type", errType))
	}
	return attrs(kvs...)
}

func holdAttrs(name string, handedOver bool, errType string) string {
	kvs := []attribute.KeyValue{
		attribute.String("netlock.lock.name", name),
		attribute.Bool("netlock.unlock.handed_over", handedOver),
	}
	if errType != "" {
		kvs = append(kvs, attribute.String("error.type", errType))
	}
	return attrs(kvs...)
}

func extendAttrs(name, errType string) string {
	kvs := []attribute.KeyValue{attribute.String("netlock.lock.name", name)}
	if errType != "" {
		kvs = append(kvs, attribute.String("error.type", errType))
	}
	return attrs(kvs...)
}

func errorAttrs(name, operation, errType string) string {
	return attrs(
		attribute.String("netlock.lock.name", name),
		attribute.String("netlock.operation", operation),
		attribute.String("error.type", errType))
}

// acquireSpans returns the ended spans of acquire calls.
func (tel *telemetry) acquireSpans() []sdktrace.ReadOnlySpan {
	return slices.DeleteFunc(tel.spans.Ended(), func(s sdktrace.ReadOnlySpan) bool { return s.Name() != "netlock.acquire" })
}

// acquireSpan returns the one ended span of an acquire call.
func (tel *telemetry) acquireSpan(t *testing.T) sdktrace.ReadOnlySpan {
	t.Helper()
	spans := tel.acquireSpans()
	if len(spans) != 1 {
		t.Fatalf("acquire spans: got %d, want 1", len(spans))
	}
	return spans[0]
}

// spanAttrs returns s's attributes, their values as strings.
func spanAttrs(s sdktrace.ReadOnlySpan) map[string]string {
	out := map[string]string{}
	for _, kv := range s.Attributes() {
		out[string(kv.Key)] = kv.Value.Emit()
	}
	return out
}

// checkSpan checks an acquire span's kind, attributes, status and events:
// an error recorded (one "exception" event) and the status Error with its
// message if err is not nil, none and the status Unset otherwise.
func checkSpan(t *testing.T, s sdktrace.ReadOnlySpan, want map[string]string, err error) {
	t.Helper()
	if s.SpanKind() != trace.SpanKindInternal {
		t.Errorf("span kind: got %v, want internal", s.SpanKind())
	}
	if got := spanAttrs(s); !maps.Equal(got, want) {
		t.Errorf("span attributes: got %v\nwant %v", got, want)
	}
	var events []string
	for _, e := range s.Events() {
		events = append(events, e.Name)
	}
	if err == nil {
		if s.Status().Code != codes.Unset || len(events) != 0 {
			t.Errorf("span: status %+v, events %v; want status Unset and no events", s.Status(), events)
		}
		return
	}
	if s.Status().Code != codes.Error || s.Status().Description != err.Error() {
		t.Errorf("span status: got %+v, want Error %q", s.Status(), err.Error())
	}
	if len(events) != 1 || events[0] != "exception" {
		t.Fatalf("span events: got %v, want one exception", events)
	}
	for _, kv := range s.Events()[0].Attributes {
		if kv.Key == "exception.message" && kv.Value.AsString() != err.Error() {
			t.Errorf("exception.message: got %q, want %q", kv.Value.AsString(), err.Error())
		}
	}
}

// newMutex returns a NetMutex named name on a redigo pool of its own, as
// another process would have; the pool is closed when the test ends.
func newMutex(t *testing.T, addr, name string, opts ...netlock.Option) *netlock.NetMutex {
	t.Helper()
	pool := &redis.Pool{
		MaxIdle: 8,
		DialContext: func(ctx context.Context) (redis.Conn, error) {
			return redis.DialContext(ctx, "tcp", addr)
		},
	}
	t.Cleanup(func() { pool.Close() })
	m, err := netlock.New(name, []netlock.Backend{netlock.NewRedigo(pool)}, opts...)
	if err != nil {
		t.Fatalf("netlock.New(%q): %v", name, err)
	}
	return m
}

// waitFor polls cond until it holds, failing the test after 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// An uncontended LockCtx, ExtendCtx and UnlockCtx: one point on each
// duration, no errors, and an acquire span that is a child of the caller's.
func TestUncontended(t *testing.T) {
	mini := miniredis.RunT(t)
	tel := newTelemetry(t)
	m := newMutex(t, mini.Addr(), "orders", netlock.WithObserver(tel.obs), netlock.WithAutoExtend(false))

	ctx, parent := tel.tracer.Start(context.Background(), "request")
	if err := m.LockCtx(ctx); err != nil {
		t.Fatal(err)
	}
	token := m.Token()
	if err := m.ExtendCtx(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.UnlockCtx(ctx); err != nil {
		t.Fatal(err)
	}
	parent.End()

	got := tel.metrics(t)
	checkCounts(t, counts(got), map[string]map[string]int64{
		"netlock.lock.wait_time":   {waitAttrs("orders", false, "acquired", false, false, ""): 1},
		"netlock.lock.hold_time":   {holdAttrs("orders", false, ""): 1},
		"netlock.lock.extend_time": {extendAttrs("orders", ""): 1},
	})
	for _, name := range []string{"netlock.lock.wait_time", "netlock.lock.hold_time", "netlock.lock.extend_time"} {
		for attrs, p := range got[name] {
			if p.sum <= 0 {
				t.Errorf("%s {%s}: sum %v, want positive", name, attrs, p.sum)
			}
		}
	}

	s := tel.acquireSpan(t)
	if s.Parent().SpanID() != parent.SpanContext().SpanID() || s.SpanContext().TraceID() != parent.SpanContext().TraceID() {
		t.Errorf("acquire span's parent: got %v, want the caller's span %v", s.Parent().SpanID(), parent.SpanContext().SpanID())
	}
	checkSpan(t, s, map[string]string{
		"netlock.lock.name":           "orders",
		"netlock.acquire.try":         "false",
		"netlock.acquire.outcome":     "acquired",
		"netlock.acquire.contended":   "false",
		"netlock.acquire.handed_over": "false",
		"netlock.lock.token":          fmt.Sprint(token),
	}, nil)
}

// A TryLock that finds the lock held elsewhere is busy, contended, and not
// an error.
func TestTryLockBusy(t *testing.T) {
	mini := miniredis.RunT(t)
	tel := newTelemetry(t)
	holder := newMutex(t, mini.Addr(), "orders")
	m := newMutex(t, mini.Addr(), "orders", netlock.WithObserver(tel.obs))
	holder.Lock()
	defer holder.Unlock()

	if m.TryLock() {
		t.Fatal("TryLock of a lock held elsewhere: got true, want false")
	}

	checkCounts(t, counts(tel.metrics(t)), map[string]map[string]int64{
		"netlock.lock.wait_time": {waitAttrs("orders", true, "busy", true, false, ""): 1},
	})
	checkSpan(t, tel.acquireSpan(t), map[string]string{
		"netlock.lock.name":           "orders",
		"netlock.acquire.try":         "true",
		"netlock.acquire.outcome":     "busy",
		"netlock.acquire.contended":   "true",
		"netlock.acquire.handed_over": "false",
	}, nil)
}

// A LockCtx that waits for another client's unlock is contended.
func TestContended(t *testing.T) {
	mini := miniredis.RunT(t)
	tel := newTelemetry(t)
	holder := newMutex(t, mini.Addr(), "orders")
	m := newMutex(t, mini.Addr(), "orders", netlock.WithObserver(tel.obs))
	holder.Lock()

	done := make(chan error, 1)
	go func() { done <- m.LockCtx(context.Background()) }()
	// The waiter's attempt found the lock held once it is in the queue.
	waitFor(t, "the waiter queued", func() bool { return mini.Exists("netlock:{orders}:waiters") })
	holder.Unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	token := m.Token()
	m.Unlock()

	checkCounts(t, counts(tel.metrics(t)), map[string]map[string]int64{
		"netlock.lock.wait_time": {waitAttrs("orders", false, "acquired", true, false, ""): 1},
		"netlock.lock.hold_time": {holdAttrs("orders", false, ""): 1},
	})
	checkSpan(t, tel.acquireSpan(t), map[string]string{
		"netlock.lock.name":           "orders",
		"netlock.acquire.try":         "false",
		"netlock.acquire.outcome":     "acquired",
		"netlock.acquire.contended":   "true",
		"netlock.acquire.handed_over": "false",
		"netlock.lock.token":          fmt.Sprint(token),
	}, nil)
}

// A LockCtx whose deadline passes while it waits is an error of type
// deadline_exceeded, on the histogram, the error counter and the span.
func TestDeadline(t *testing.T) {
	mini := miniredis.RunT(t)
	tel := newTelemetry(t)
	holder := newMutex(t, mini.Addr(), "orders")
	m := newMutex(t, mini.Addr(), "orders", netlock.WithObserver(tel.obs))
	holder.Lock()
	defer holder.Unlock()

	// Long enough that the first attempt, which finds the lock held, is
	// made before it passes.
	const timeout = 250 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := m.LockCtx(ctx)
	if !errors.Is(err, netlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("LockCtx: got %v, want ErrNotObtained and DeadlineExceeded", err)
	}

	got := tel.metrics(t)
	wait := waitAttrs("orders", false, "error", true, false, "deadline_exceeded")
	checkCounts(t, counts(got), map[string]map[string]int64{
		"netlock.lock.wait_time": {wait: 1},
		"netlock.lock.errors":    {errorAttrs("orders", "acquire", "deadline_exceeded"): 1},
	})
	if sum := got["netlock.lock.wait_time"][wait].sum; sum < timeout.Seconds() {
		t.Errorf("wait time: got %vs, want at least the timeout, %v", sum, timeout)
	}
	checkSpan(t, tel.acquireSpan(t), map[string]string{
		"netlock.lock.name":           "orders",
		"netlock.acquire.try":         "false",
		"netlock.acquire.outcome":     "error",
		"netlock.acquire.contended":   "true",
		"netlock.acquire.handed_over": "false",
		"error.type":                  "deadline_exceeded",
	}, err)
}

// A TryLockCtx that cannot reach Redis is an error of type quorum.
func TestRedisDown(t *testing.T) {
	mini := miniredis.RunT(t)
	tel := newTelemetry(t)
	m := newMutex(t, mini.Addr(), "orders", netlock.WithObserver(tel.obs))
	mini.Close()

	ok, err := m.TryLockCtx(context.Background())
	if ok || !errors.Is(err, netlock.ErrQuorum) {
		t.Fatalf("TryLockCtx with Redis down: got %v, %v; want false and ErrQuorum", ok, err)
	}

	checkCounts(t, counts(tel.metrics(t)), map[string]map[string]int64{
		"netlock.lock.wait_time": {waitAttrs("orders", true, "error", false, false, "quorum"): 1},
		"netlock.lock.errors":    {errorAttrs("orders", "acquire", "quorum"): 1},
	})
	checkSpan(t, tel.acquireSpan(t), map[string]string{
		"netlock.lock.name":           "orders",
		"netlock.acquire.try":         "true",
		"netlock.acquire.outcome":     "error",
		"netlock.acquire.contended":   "false",
		"netlock.acquire.handed_over": "false",
		"error.type":                  "quorum",
	}, err)
}

// A hold whose key is deleted is lost once: the watchdog's extend finds it
// gone, and Unlock reports it lost.
func TestLostHold(t *testing.T) {
	mini := miniredis.RunT(t)
	tel := newTelemetry(t)
	m := newMutex(t, mini.Addr(), "orders", netlock.WithObserver(tel.obs),
		netlock.WithExpiry(300*time.Millisecond), netlock.WithNodeTimeout(100*time.Millisecond),
		netlock.WithLogger(slog.New(slog.DiscardHandler)))
	m.Lock()
	mini.Del("netlock:{orders}")
	lost := m.Lost()
	waitFor(t, "Lost()", func() bool {
		select {
		case <-lost:
			return true
		default:
			return false
		}
	})
	if err := m.UnlockCtx(context.Background()); !errors.Is(err, netlock.ErrLockLost) {
		t.Fatalf("UnlockCtx of a lost hold: got %v, want ErrLockLost", err)
	}

	got := counts(tel.metrics(t))
	// Extends that the watchdog made before the key was deleted succeeded;
	// how many there were is up to the scheduler.
	delete(got["netlock.lock.extend_time"], extendAttrs("orders", ""))
	checkCounts(t, got, map[string]map[string]int64{
		"netlock.lock.wait_time":   {waitAttrs("orders", false, "acquired", false, false, ""): 1},
		"netlock.lock.hold_time":   {holdAttrs("orders", false, "lock_lost"): 1},
		"netlock.lock.extend_time": {extendAttrs("orders", "lock_lost"): 1},
		"netlock.lock.lost_holds":  {attrs(attribute.String("netlock.lock.name", "orders"), attribute.String("netlock.lost.reason", "extend")): 1},
		"netlock.lock.errors": {
			errorAttrs("orders", "extend", "lock_lost"): 1,
			errorAttrs("orders", "unlock", "lock_lost"): 1,
		},
	})
}

// Goroutines sharing a NetMutex hand the hold to each other: every hold
// handed over by an unlock is an acquire handed over, contended, with the
// hold's token on its span.
func TestHandOffs(t *testing.T) {
	mini := miniredis.RunT(t)
	tel := newTelemetry(t)
	m := newMutex(t, mini.Addr(), "orders", netlock.WithObserver(tel.obs))

	const goroutines = 8
	calls := 0
	handedOver := func() int64 {
		return counts(tel.metrics(t))["netlock.lock.hold_time"][holdAttrs("orders", true, "")]
	}
	// Whether an unlock finds a goroutine waiting is up to the scheduler;
	// with eight of them at once, the first round nearly always has one.
	for round := 0; round < 50 && handedOver() == 0; round++ {
		var wg sync.WaitGroup
		for range goroutines {
			wg.Go(func() { m.Lock(); m.Unlock() })
		}
		wg.Wait()
		calls += goroutines
	}

	got := counts(tel.metrics(t))
	handOffs := got["netlock.lock.hold_time"][holdAttrs("orders", true, "")]
	if handOffs == 0 {
		t.Fatalf("no hand-off in %d calls", calls)
	}
	var fromRedis, uncontended int64
	for attrs, n := range got["netlock.lock.wait_time"] {
		switch attrs {
		case waitAttrs("orders", false, "acquired", true, true, ""):
			if n != handOffs {
				t.Errorf("acquires handed over: got %d, want %d, the unlocks that handed over", n, handOffs)
			}
		case waitAttrs("orders", false, "acquired", true, false, ""):
			fromRedis += n
		case waitAttrs("orders", false, "acquired", false, false, ""):
			uncontended += n
		default:
			t.Errorf("wait_time: unexpected point {%s}: %d", attrs, n)
		}
	}
	if handOffs+fromRedis+uncontended != int64(calls) {
		t.Errorf("acquires: got %d, want %d", handOffs+fromRedis+uncontended, calls)
	}
	if n := got["netlock.lock.hold_time"][holdAttrs("orders", false, "")]; n+handOffs != int64(calls) {
		t.Errorf("unlocks: got %d released and %d handed over, want %d in all", n, handOffs, calls)
	}

	spans := tel.acquireSpans()
	var spansHandedOver int64
	for _, s := range spans {
		a := spanAttrs(s)
		if a["netlock.acquire.outcome"] != "acquired" || a["netlock.lock.token"] == "" {
			t.Errorf("acquire span: got %v, want acquired with a token", a)
		}
		if a["netlock.acquire.handed_over"] == "true" {
			spansHandedOver++
			if a["netlock.acquire.contended"] != "true" {
				t.Errorf("span of a hand-off: got %v, want contended", a)
			}
		}
	}
	if len(spans) != calls || spansHandedOver != handOffs {
		t.Errorf("acquire spans: got %d, %d handed over; want %d, %d handed over", len(spans), spansHandedOver, calls, handOffs)
	}
}

// WithMetricLockName maps names for metrics only; "" leaves the attribute
// out.
func TestMetricLockName(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lockName func(string) string
		want     string // the value of netlock.lock.name in metrics, "" for none
	}{
		{"kind", func(name string) string { kind, _, _ := strings.Cut(name, ":"); return kind }, "order"},
		{"left out", func(string) string { return "" }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mini := miniredis.RunT(t)
			tel := newTelemetry(t, WithMetricLockName(tc.lockName))
			for _, name := range []string{"order:1", "order:2"} {
				m := newMutex(t, mini.Addr(), name, netlock.WithObserver(tel.obs))
				m.Lock()
				m.Unlock()
			}

			checkCounts(t, counts(tel.metrics(t)), map[string]map[string]int64{
				"netlock.lock.wait_time": {waitAttrs(tc.want, false, "acquired", false, false, ""): 2},
				"netlock.lock.hold_time": {holdAttrs(tc.want, false, ""): 2},
			})
			var names []string
			for _, s := range tel.acquireSpans() {
				names = append(names, spanAttrs(s)["netlock.lock.name"])
			}
			if !slices.Equal(names, []string{"order:1", "order:2"}) {
				t.Errorf("spans' lock names: got %q, want the full names", names)
			}
		})
	}
}

// A Semaphore's acquire span carries netlock.lock.kind "semaphore".
func TestSemaphoreKind(t *testing.T) {
	mini := miniredis.RunT(t)
	tel := newTelemetry(t)
	pool := &redis.Pool{MaxIdle: 4, DialContext: func(ctx context.Context) (redis.Conn, error) {
		return redis.DialContext(ctx, "tcp", mini.Addr())
	}}
	t.Cleanup(func() { pool.Close() })
	sem, err := netlock.NewSemaphore("slots", 2, []netlock.Backend{netlock.NewRedigo(pool)}, netlock.WithObserver(tel.obs))
	if err != nil {
		t.Fatal(err)
	}
	if err := sem.Acquire(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	sem.Release(1)
	got := spanAttrs(tel.acquireSpan(t))
	if got["netlock.lock.kind"] != "semaphore" || got["netlock.lock.name"] != "slots" {
		t.Fatalf("span attributes: %v, want netlock.lock.kind semaphore and the name", got)
	}
}
