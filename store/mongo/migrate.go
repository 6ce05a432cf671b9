package mongo

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/outboxkit/outboxkit/internal/migrations"
	"github.com/outboxkit/outboxkit/outbox"
)

// Migration is one schema version. Up and Down are mongosh commands
// (db.runCommand(...) and db.getCollection(...).drop() lines) that do what
// Migrate and MigrateTo do, without the version record.
type Migration = migrations.Migration

// step is one database command of a migration, or the drop of a collection
// (drop ignores a collection that does not exist, as the driver's and
// mongosh's drop helpers do).
type step struct {
	cmd  bson.D // a command for db.runCommand
	drop string // else the collection to drop
}

// migration is one version: the steps that apply it and those that revert
// it.
type migration struct {
	version  int
	name     string
	up, down []step
}

// ix is one index of a createIndexes command.
type ix struct {
	name   string
	keys   bson.D
	unique bool
}

func createIndexes(coll string, idx ...ix) step {
	specs := make(bson.A, len(idx))
	for i, x := range idx {
		spec := bson.D{{Key: "key", Value: x.keys}, {Key: "name", Value: x.name}}
		if x.unique {
			spec = append(spec, bson.E{Key: "unique", Value: true})
		}
		specs[i] = spec
	}
	return step{cmd: bson.D{{Key: "createIndexes", Value: coll}, {Key: "indexes", Value: specs}}}
}

func asc(fields ...string) bson.D {
	d := make(bson.D, len(fields))
	for i, f := range fields {
		d[i] = bson.E{Key: f, Value: int32(1)}
	}
	return d
}

// schema returns the Store's migrations, oldest first.
func (s *Store) schema() []migration {
	msgs, atts, inbox, pauses := s.msgs.Name(), s.attempts.Name(), s.inbox.Name(), s.pauses.Name()
	return []migration{{
		version: 1, name: "init",
		up: []step{
			createIndexes(msgs,
				// Idempotency: one message per (tenant, key).
				ix{"tenant_key", asc("tenant", "key"), true},
				// Seq is unique: it orders groups and pages listings.
				ix{"seq", asc("seq"), true},
				// Claim: due PENDING messages in seq order, unordered ones apart.
				ix{"claim", asc("status", "gkey", "seq"), false},
				// A group's open messages in order (fin changes only when a
				// message finishes or is requeued).
				ix{"group_open", asc("gkey", "fin", "seq"), false},
				// Recovery of expired leases.
				ix{"lease", asc("status", "claimed_at"), false},
				// Receipts find a message by its provider ID within a tenant.
				ix{"provider", asc("tenant", "prov_id"), false},
				// Tenant-scoped listings and counts.
				ix{"tenant_seq", asc("tenant", "seq"), false},
				// Prune: finished messages by age.
				ix{"prune", asc("fin", "updated_at"), false}),
			createIndexes(atts,
				ix{"message", asc("tenant", "msg_id", "n"), false},
				ix{"msg_id", asc("msg_id"), false}),
			createIndexes(inbox, ix{"at", asc("at"), false}),
		},
		down: []step{{drop: msgs}, {drop: atts}, {drop: s.locks.Name()}, {drop: s.counters.Name()}, {drop: inbox}},
	}, {
		version: 2, name: "admin",
		up: []step{
			// Operators: the oldest PENDING message of a topic (TopicStats)
			// and a topic's messages of one status.
			createIndexes(msgs, ix{"status_topic_created", asc("status", "topic", "created_at"), false}),
			// Pauses, listed in order; the _id makes each one unique.
			createIndexes(pauses, ix{"pause_order", asc("topic", "grp", "tenant"), false}),
		},
		down: []step{
			{cmd: bson.D{{Key: "dropIndexes", Value: msgs}, {Key: "index", Value: "status_topic_created"}}},
			{drop: pauses},
		},
	}}
}

// render writes steps as mongosh lines.
func render(steps []step) string {
	var b strings.Builder
	for _, st := range steps {
		if st.drop != "" {
			b.WriteString("db.getCollection(" + strconv.Quote(st.drop) + ").drop();\n")
			continue
		}
		j, err := bson.MarshalExtJSON(st.cmd, false, false)
		if err != nil {
			panic("mongo: rendering a migration command: " + err.Error()) // the commands are constants of this file
		}
		b.WriteString("db.runCommand(" + string(j) + ");\n")
	}
	return b.String()
}

// Migrations returns the Store's migrations, oldest first, rendered as
// mongosh commands for its collection prefix: run them with
// `mongosh "mongodb://host/DB" file.js` to create the schema without
// Migrate (outboxctl migrate sql prints them). They do not record the
// version, which Migrate keeps in the <prefix>migrations collection.
func (s *Store) Migrations() []Migration {
	ms := s.schema()
	out := make([]Migration, len(ms))
	for i, m := range ms {
		out[i] = Migration{Version: m.version, Name: m.name, Up: render(m.up), Down: render(m.down)}
	}
	return out
}

// Migrate applies the migrations not yet applied: it creates the
// collections' indexes (the unique ones carry idempotency and the
// sequence) and records each version in the <prefix>migrations collection.
// Every step is idempotent, so Migrate is safe to run from several
// processes at once, and over a database migrated before versions were
// recorded.
func (s *Store) Migrate(ctx context.Context) error {
	ms := s.schema()
	return s.MigrateTo(ctx, ms[len(ms)-1].version)
}

// MigrateDown removes the Store's collections, with their data, and its
// version record (MigrateTo 0).
func (s *Store) MigrateDown(ctx context.Context) error { return s.MigrateTo(ctx, 0) }

type versionDoc struct {
	Version   int       `bson:"_id"`
	Name      string    `bson:"name"`
	AppliedAt time.Time `bson:"applied_at"`
}

// MigrateTo moves the schema to version target: up when it is behind, down
// (newest first) when it is ahead. Version 0 drops every collection of the
// Store, the version record included.
func (s *Store) MigrateTo(ctx context.Context, target int) error {
	ms := s.schema()
	if target < 0 || target > ms[len(ms)-1].version {
		return outbox.InvalidParam("version", fmt.Sprintf("%d is not between 0 and %d", target, ms[len(ms)-1].version))
	}
	applied, err := s.applied(ctx)
	if err != nil {
		return err
	}
	for _, m := range ms {
		if m.version > target || applied[m.version] {
			continue
		}
		if err := s.run(ctx, m.up); err != nil {
			return fmt.Errorf("mongo: migration %03d_%s up: %w", m.version, m.name, err)
		}
		_, err := s.versions.InsertOne(ctx, versionDoc{Version: m.version, Name: m.name, AppliedAt: s.now(time.Time{})})
		if err != nil && !mongo.IsDuplicateKeyError(err) {
			return fmt.Errorf("mongo: record migration %d: %w", m.version, err)
		}
		s.log.InfoContext(ctx, "outboxkit/mongo: migrated", "version", m.version, "name", m.name)
	}
	for i := len(ms) - 1; i >= 0; i-- {
		m := ms[i]
		if m.version <= target || !applied[m.version] {
			continue
		}
		if err := s.run(ctx, m.down); err != nil {
			return fmt.Errorf("mongo: migration %03d_%s down: %w", m.version, m.name, err)
		}
		if _, err := s.versions.DeleteOne(ctx, bson.D{{Key: "_id", Value: m.version}}); err != nil {
			return fmt.Errorf("mongo: unrecord migration %d: %w", m.version, err)
		}
		s.log.InfoContext(ctx, "outboxkit/mongo: reverted", "version", m.version, "name", m.name)
	}
	if target == 0 {
		if err := s.versions.Drop(ctx); err != nil {
			return fmt.Errorf("mongo: migrate: drop %s: %w", s.versions.Name(), err)
		}
	}
	return nil
}

// applied reads the recorded versions.
func (s *Store) applied(ctx context.Context) (map[int]bool, error) {
	cur, err := s.versions.Find(ctx, bson.D{}, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("mongo: migrate: read %s: %w", s.versions.Name(), err)
	}
	var docs []versionDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("mongo: migrate: read %s: %w", s.versions.Name(), err)
	}
	out := make(map[int]bool, len(docs))
	for _, d := range docs {
		out[d.Version] = true
	}
	return out, nil
}

// SchemaVersion returns the newest applied migration version, 0 when none
// is recorded.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var d versionDoc
	err := s.versions.FindOne(ctx, bson.D{}, options.FindOne().SetSort(bson.D{{Key: "_id", Value: -1}})).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("mongo: schema version: %w", err)
	}
	return d.Version, nil
}

// Server error codes a migration step tolerates.
const (
	codeNamespaceNotFound = 26
	codeIndexNotFound     = 27
)

func (s *Store) run(ctx context.Context, steps []step) error {
	for _, st := range steps {
		if st.drop != "" {
			if err := s.db.Collection(st.drop).Drop(ctx); err != nil {
				return fmt.Errorf("drop %s: %w", st.drop, err)
			}
			continue
		}
		cmd, err := s.missingIndexes(ctx, st.cmd)
		if err != nil {
			return err
		}
		if cmd == nil {
			continue
		}
		err = s.db.RunCommand(ctx, cmd).Err()
		var ce mongo.CommandError
		if errors.As(err, &ce) && (ce.Code == codeNamespaceNotFound || ce.Code == codeIndexNotFound) {
			err = nil // reverting what is already gone
		}
		if err != nil {
			return fmt.Errorf("%s %v: %w", st.cmd[0].Key, st.cmd[0].Value, err)
		}
	}
	return nil
}

// missingIndexes returns cmd, or for a createIndexes command the same
// command with only the indexes the collection lacks (nil when it has them
// all). MongoDB ignores an index that exists already, but FerretDB v1.24
// drops the connection (its handler panics) on a createIndexes of several
// indexes that all exist.
func (s *Store) missingIndexes(ctx context.Context, cmd bson.D) (bson.D, error) {
	if cmd[0].Key != "createIndexes" {
		return cmd, nil
	}
	coll := cmd[0].Value.(string)
	cur, err := s.db.Collection(coll).Indexes().List(ctx)
	var ce mongo.CommandError
	if errors.As(err, &ce) && ce.Code == codeNamespaceNotFound {
		return cmd, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list indexes of %s: %w", coll, err)
	}
	var have []struct {
		Name string `bson:"name"`
	}
	if err := cur.All(ctx, &have); err != nil {
		return nil, fmt.Errorf("list indexes of %s: %w", coll, err)
	}
	exists := map[string]bool{}
	for _, h := range have {
		exists[h.Name] = true
	}
	var missing bson.A
	for _, spec := range cmd[1].Value.(bson.A) {
		if name, _ := spec.(bson.D)[1].Value.(string); !exists[name] {
			missing = append(missing, spec)
		}
	}
	if len(missing) == 0 {
		return nil, nil
	}
	return bson.D{cmd[0], {Key: "indexes", Value: missing}}, nil
}
