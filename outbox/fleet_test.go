package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// nopLeaser satisfies outbox.ShardLeaser for configuration checks; the
// fleet's behaviour is tested against PostgreSQL (store/postgres).
type nopLeaser struct{ outbox.ShardLeaser }

type alwaysLeader struct{}

func (alwaysLeader) IsLeader() bool { return true }

func TestNewFleetValidates(t *testing.T) {
	t.Parallel()
	valid := func() outbox.FleetConfig {
		return outbox.FleetConfig{
			Databases: outbox.StaticDatabases("a", "b"),
			Open:      func(context.Context, string) (outbox.ShardStore, error) { return outbox.ShardStore{}, nil },
			Publisher: outbox.PublishEach(func(context.Context, outbox.Message) outbox.Result { return outbox.Result{} }),
			Leaser:    nopLeaser{},
			Processor: outbox.Config{AllTopics: true},
		}
	}
	for _, tc := range []struct {
		name, field string
		edit        func(*outbox.FleetConfig)
	}{
		{"no databases", "FleetConfig.Databases", func(c *outbox.FleetConfig) { c.Databases = nil }},
		{"no open", "FleetConfig.Open", func(c *outbox.FleetConfig) { c.Open = nil }},
		{"no publisher", "FleetConfig.Publisher", func(c *outbox.FleetConfig) { c.Publisher = nil }},
		{"no leaser", "FleetConfig.Leaser", func(c *outbox.FleetConfig) { c.Leaser = nil }},
		{"short lease", "FleetConfig.LeaseTTL", func(c *outbox.FleetConfig) { c.LeaseTTL = time.Millisecond }},
		{"negative MaxStarting", "FleetConfig.MaxStarting", func(c *outbox.FleetConfig) { c.MaxStarting = -1 }},
		{"drain outlives the lease", "FleetConfig.Processor.DrainTimeout", func(c *outbox.FleetConfig) {
			c.LeaseTTL, c.Processor.DrainTimeout = 4*time.Second, 2*time.Second
		}},
		{"a leader", "FleetConfig.Processor.Leader", func(c *outbox.FleetConfig) { c.Processor.Leader = alwaysLeader{} }},
		{"invalid processor config", "Config.PollInterval", func(c *outbox.FleetConfig) { c.Processor.PollInterval = -time.Second }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := valid()
			tc.edit(&cfg)
			_, err := outbox.NewFleet(cfg)
			var ve *outbox.ValidationError
			if !errors.As(err, &ve) || ve.Field != tc.field {
				t.Fatalf("NewFleet = %v, want a *ValidationError on %s", err, tc.field)
			}
		})
	}
	f, err := outbox.NewFleet(valid())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(f.ID(), "-") {
		t.Fatalf("default ID %q is not <hostname>-<random>", f.ID())
	}
	if st := f.Status(); st.ID != f.ID() || len(st.Shards) != 0 {
		t.Fatalf("status before Run = %+v", st)
	}
}
