package otelnetlock

import (
	"strings"
	"testing"
)

// NewObserver without options takes the global providers.
func TestNewObserverDefaults(t *testing.T) {
	obs, err := NewObserver()
	if err != nil {
		t.Fatalf("NewObserver(): %v", err)
	}
	if obs.Acquire == nil || obs.Unlock == nil || obs.Extend == nil || obs.Lost == nil {
		t.Errorf("NewObserver(): got %+v, want every function set", obs)
	}
}

func TestNewObserverBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  Option
		want string
	}{
		{"nil option", nil, "option 0 is nil"},
		{"nil meter provider", WithMeterProvider(nil), "meter provider is nil"},
		{"nil tracer provider", WithTracerProvider(nil), "tracer provider is nil"},
		{"nil lock name function", WithMetricLockName(nil), "lock name function is nil"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewObserver(tc.opt)
			if err == nil || !strings.HasPrefix(err.Error(), "otelnetlock: bad options: ") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewObserver: got %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
