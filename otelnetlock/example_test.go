package otelnetlock_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/gomodule/redigo/redis"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/netlock-go/netlock"
	"github.com/netlock-go/netlock/otelnetlock"
)

// An Observer is given to each NetMutex with netlock.WithObserver. In a
// service, NewObserver() with no options records into the global providers
// that the service's OpenTelemetry setup installs; here an in-memory reader
// shows what it records.
func Example() {
	srv := miniredis.NewMiniRedis() // a real Redis address in production
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	pool := &redis.Pool{DialContext: func(ctx context.Context) (redis.Conn, error) {
		return redis.DialContext(ctx, "tcp", srv.Addr())
	}}
	defer pool.Close()

	reader := sdkmetric.NewManualReader()
	obs, err := otelnetlock.NewObserver(otelnetlock.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		panic(err)
	}
	backends := []netlock.Backend{netlock.NewRedigo(pool)}
	mu, err := netlock.New("orders", backends, netlock.WithObserver(obs))
	if err != nil {
		panic(err)
	}
	other, _ := netlock.New("orders", backends) // as in another process

	mu.Lock()
	mu.Unlock()
	other.Lock()
	fmt.Println("TryLock while held elsewhere:", mu.TryLock())
	other.Unlock()

	// Acquisitions and contention are counts of the wait time histogram.
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name != "netlock.lock.wait_time" {
			continue
		}
		for _, p := range m.Data.(metricdata.Histogram[float64]).DataPoints {
			outcome, _ := p.Attributes.Value("netlock.acquire.outcome")
			contended, _ := p.Attributes.Value("netlock.acquire.contended")
			fmt.Printf("%s: outcome=%s contended=%v: %d\n", m.Name, outcome.Emit(), contended.Emit(), p.Count)
		}
	}
	// Unordered output:
	// TryLock while held elsewhere: false
	// netlock.lock.wait_time: outcome=acquired contended=false: 1
	// netlock.lock.wait_time: outcome=busy contended=true: 1
}

// An application that locks one name per order maps each name to its kind
// for metrics, so that it does not make time series per order. Spans keep
// the full name.
func ExampleWithMetricLockName() {
	srv := miniredis.NewMiniRedis()
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Close()
	pool := &redis.Pool{DialContext: func(ctx context.Context) (redis.Conn, error) {
		return redis.DialContext(ctx, "tcp", srv.Addr())
	}}
	defer pool.Close()

	reader := sdkmetric.NewManualReader()
	obs, err := otelnetlock.NewObserver(
		otelnetlock.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))),
		otelnetlock.WithMetricLockName(func(name string) string {
			kind, _, _ := strings.Cut(name, ":") // "order:42" is an "order"
			return kind
		}))
	if err != nil {
		panic(err)
	}
	for _, order := range []string{"order:42", "order:43"} {
		mu, err := netlock.New(order, []netlock.Backend{netlock.NewRedigo(pool)}, netlock.WithObserver(obs))
		if err != nil {
			panic(err)
		}
		mu.Lock()
		mu.Unlock()
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name != "netlock.lock.wait_time" {
			continue
		}
		for _, p := range m.Data.(metricdata.Histogram[float64]).DataPoints {
			name, _ := p.Attributes.Value(attribute.Key("netlock.lock.name"))
			fmt.Printf("%s: netlock.lock.name=%s: %d\n", m.Name, name.Emit(), p.Count)
		}
	}
	// Output: netlock.lock.wait_time: netlock.lock.name=order: 2
}
