package service

import (
	"context"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/outboxkit/outboxkit/outbox"
	outboxotel "github.com/outboxkit/outboxkit/outbox/otel"
)

// setupMetrics builds the service's metrics: outboxkit's OpenTelemetry
// observer (outbox/otel: the outbound_message_* counters and histograms,
// the queue depth and oldest pending gauges) and the HTTP server's
// (otelhttp: http_server_request_duration_seconds and body sizes), all on
// one OpenTelemetry meter provider whose reader is the Prometheus exporter,
// on a registry of the service's own (with the Go runtime's and the
// process's collectors) served at MetricsPath. With DisableMetrics the
// observer still runs, on a meter provider nobody reads.
func (s *Service) setupMetrics() error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	s.close = append(s.close, func() error { return mp.Shutdown(context.Background()) })
	s.mp = mp
	tel, err := outboxotel.New(outboxotel.Config{MeterProvider: mp, Store: s.store})
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	s.close = append(s.close, tel.Close)
	s.tel = tel
	if !s.cfg.DisableMetrics {
		s.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	}
	return nil
}

// measure wraps the service's handler in otelhttp's server metrics.
func (s *Service) measure(h http.Handler) http.Handler {
	return otelhttp.NewHandler(h, "messaging-service", otelhttp.WithMeterProvider(s.mp))
}

// observer is what the processor, the enqueue path and the webhook report
// to: the log and the metrics.
func (s *Service) observer() outbox.Observer {
	return outbox.Observers{logObserver{log: s.log}, s.tel}
}

func (s *Service) serveMetrics(w http.ResponseWriter, r *http.Request, _ string) {
	if s.metrics == nil {
		writeError(w, http.StatusNotFound, "not_found", "metrics are not served (disabled)")
		return
	}
	s.metrics.ServeHTTP(w, r)
}
