package otelnetlock

import (
	"errors"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// An Option configures the Observer NewObserver returns. Options are applied
// and validated once, by NewObserver.
type Option func(*config)

// config is the resolved configuration of an Observer.
type config struct {
	meterProvider     metric.MeterProvider
	meterProviderSet  bool
	tracerProvider    trace.TracerProvider
	tracerProviderSet bool
	lockName          func(name string) string // the value of netlock.lock.name in metrics
}

// WithMeterProvider sets the MeterProvider the Observer's instruments come
// from; it must not be nil. Without this option, NewObserver takes
// otel.GetMeterProvider(), the global provider, which forwards to one set
// later with otel.SetMeterProvider.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.meterProvider, c.meterProviderSet = mp, true }
}

// WithTracerProvider sets the TracerProvider the Observer's spans come from;
// it must not be nil. Without this option, NewObserver takes
// otel.GetTracerProvider(), the global provider, which forwards to one set
// later with otel.SetTracerProvider.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tracerProvider, c.tracerProviderSet = tp, true }
}

// WithMetricLockName sets the value of the netlock.lock.name attribute of
// every metric about a lock: f(name), or no attribute where f returns "".
// By default it is the name itself. Use it when an application locks many
// distinct names (one per user, per order), each of which would otherwise
// make time series of its own: map a name to its kind, or leave it out.
// Spans always carry the full name. f is called for every metric recorded,
// possibly from many goroutines at once: it must be safe for concurrent use
// and quick.
func WithMetricLockName(f func(name string) string) Option {
	return func(c *config) { c.lockName = f }
}

// newConfig applies opts over the defaults and validates the result.
func newConfig(opts []Option) (config, error) {
	c := config{lockName: func(name string) string { return name }}
	var errs []string
	for i, o := range opts {
		if o == nil {
			errs = append(errs, fmt.Sprintf("option %d is nil", i))
			continue
		}
		o(&c)
	}
	switch {
	case !c.meterProviderSet:
		c.meterProvider = otel.GetMeterProvider()
	case c.meterProvider == nil:
		errs = append(errs, "the meter provider is nil")
	}
	switch {
	case !c.tracerProviderSet:
		c.tracerProvider = otel.GetTracerProvider()
	case c.tracerProvider == nil:
		errs = append(errs, "the tracer provider is nil")
	}
	if c.lockName == nil {
		errs = append(errs, "the lock name function is nil (to leave the name out, return \"\")")
	}
	if len(errs) > 0 {
		return c, errors.New("otelnetlock: bad options: " + strings.Join(errs, "; "))
	}
	return c, nil
}
