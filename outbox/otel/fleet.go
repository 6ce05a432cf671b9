package outboxotel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/outboxkit/outboxkit/outbox"
)

// Metrics of an outbox.Fleet (ObserveFleet), from this instance's view.
const (
	MetricFleetDatabases     = "outbound_fleet_databases"       // gauge: databases this instance serves
	MetricFleetMembers       = "outbound_fleet_members"         // gauge: live instances of the fleet
	MetricFleetShardHealthy  = "outbound_fleet_shard_healthy"   // gauge {database}: 1 when its processor runs and its last store call succeeded, else 0
	MetricFleetShardInFlight = "outbound_fleet_shard_in_flight" // gauge {database}: claimed messages held in memory
	MetricFleetShardSent     = "outbound_fleet_shard_sent"      // counter {database}: messages sent since this instance took the database (starts again at 0 when it takes it again)
)

// AttrDatabase names a fleet's database.
const AttrDatabase = attribute.Key("database")

// ObserveFleet reports f's Status at every collection of mp's meters (the
// global provider when mp is nil): how many databases this instance
// serves and how many instances are live, and for each database it
// serves whether its processor is healthy, what it holds in flight and
// what it sent. The processors' own metrics come from the Telemetry set
// as the fleet's Processor.Observer. Call the returned function to stop.
func ObserveFleet(mp metric.MeterProvider, f *outbox.Fleet) (stop func() error, err error) {
	if f == nil {
		return nil, errors.New("outboxotel: ObserveFleet: fleet is nil")
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	dbs, err1 := m.Int64ObservableGauge(MetricFleetDatabases, metric.WithDescription("Databases this fleet instance serves."), metric.WithUnit("{database}"))
	members, err2 := m.Int64ObservableGauge(MetricFleetMembers, metric.WithDescription("Live instances of the fleet."), metric.WithUnit("{instance}"))
	healthy, err3 := m.Int64ObservableGauge(MetricFleetShardHealthy, metric.WithDescription("1 when the database's processor runs and its last store call succeeded."))
	inflight, err4 := m.Int64ObservableGauge(MetricFleetShardInFlight, metric.WithDescription("Claimed messages of the database held in memory."), metric.WithUnit("{message}"))
	sent, err5 := m.Int64ObservableCounter(MetricFleetShardSent, metric.WithDescription("Messages of the database sent since this instance took it."), metric.WithUnit("{message}"))
	if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
		return nil, err
	}
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := f.Status()
		o.ObserveInt64(dbs, int64(len(st.Shards)))
		o.ObserveInt64(members, int64(len(st.Members)))
		for _, s := range st.Shards {
			set := metric.WithAttributeSet(attribute.NewSet(AttrDatabase.String(s.Database)))
			ok := int64(0)
			if s.Health.Healthy && !s.Stopping {
				ok = 1
			}
			o.ObserveInt64(healthy, ok, set)
			o.ObserveInt64(inflight, s.Progress.InFlight, set)
			o.ObserveInt64(sent, s.Progress.Sent, set)
		}
		return nil
	}, dbs, members, healthy, inflight, sent)
	if err != nil {
		return nil, err
	}
	return reg.Unregister, nil
}
