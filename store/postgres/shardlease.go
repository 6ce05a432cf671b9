package postgres

import (
	"context"
	"fmt"
	"hash/fnv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxkit/outboxkit/outbox"
)

// ShardLeaserOptions configures a ShardLeaser. The zero value is valid.
type ShardLeaserOptions struct {
	// Schema holds the lease tables. It must be a lowercase SQL identifier.
	// Defaults to "public".
	Schema string
	// TablePrefix starts the table names (<prefix>fleet_leases,
	// <prefix>fleet_members). Defaults to "outbox_".
	TablePrefix string
}

// ShardLeaser implements outbox.ShardLeaser in two small tables of one
// PostgreSQL database: the coordination store of an outbox.Fleet. Every
// instance of the fleet uses the same database for it (one of the fleet's
// databases or another); each renewal round is three short statements.
// Lease times use the database's clock, so the instances' clocks need not
// agree.
//
//	leaser, err := postgres.NewShardLeaser(coordPool, postgres.ShardLeaserOptions{})
//	if err != nil { ... }
//	if err := leaser.Migrate(ctx); err != nil { ... }
//	fleet, err := outbox.NewFleet(outbox.FleetConfig{Leaser: leaser, ...})
type ShardLeaser struct {
	db      DB
	schema  string
	leases  string
	members string
	lockKey int64
}

// NewShardLeaser returns a ShardLeaser on db (a *pgxpool.Pool, usually).
func NewShardLeaser(db DB, opts ShardLeaserOptions) (*ShardLeaser, error) {
	if db == nil {
		return nil, outbox.InvalidParam("db", "is nil")
	}
	if opts.Schema == "" {
		opts.Schema = "public"
	}
	if opts.TablePrefix == "" {
		opts.TablePrefix = "outbox_"
	}
	if !identRE.MatchString(opts.Schema) {
		return nil, outbox.InvalidParam("ShardLeaserOptions.Schema", fmt.Sprintf("%q is not a lowercase SQL identifier", opts.Schema))
	}
	if !identRE.MatchString(opts.TablePrefix) {
		return nil, outbox.InvalidParam("ShardLeaserOptions.TablePrefix", fmt.Sprintf("%q is not a lowercase identifier fragment", opts.TablePrefix))
	}
	l := &ShardLeaser{
		db: db, schema: opts.Schema,
		leases:  opts.Schema + "." + opts.TablePrefix + "fleet_leases",
		members: opts.Schema + "." + opts.TablePrefix + "fleet_members",
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte("outboxkit:fleet:" + l.leases))
	l.lockKey = int64(h.Sum64()) //nolint:gosec // a hash, wrapping is intended
	return l, nil
}

// Migrate creates the schema and the two tables when missing. It is safe
// from many instances at once.
func (l *ShardLeaser) Migrate(ctx context.Context) error {
	return pgx.BeginFunc(ctx, l.db, func(tx pgx.Tx) error {
		// Concurrent CREATE ... IF NOT EXISTS can still collide.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, l.lockKey); err != nil {
			return wrapErr("shard leaser migrate", err)
		}
		for _, q := range []string{
			`CREATE SCHEMA IF NOT EXISTS ` + l.schema,
			`CREATE TABLE IF NOT EXISTS ` + l.leases + ` (
				shard text PRIMARY KEY,
				owner text NOT NULL,
				epoch bigint NOT NULL,
				expires_at timestamptz NOT NULL)`,
			`CREATE TABLE IF NOT EXISTS ` + l.members + ` (
				member text PRIMARY KEY,
				expires_at timestamptz NOT NULL)`,
		} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return wrapErr("shard leaser migrate", err)
			}
		}
		return nil
	})
}

func scanLeases(rows pgx.Rows, op string) ([]outbox.ShardLease, error) {
	var out []outbox.ShardLease
	for rows.Next() {
		var sl outbox.ShardLease
		var exp pgtype.Timestamptz // '-infinity' once released
		if err := rows.Scan(&sl.Shard, &sl.Owner, &sl.Epoch, &sl.Expired, &exp); err != nil {
			rows.Close()
			return nil, wrapErr(op, err)
		}
		if exp.Valid && exp.InfinityModifier == pgtype.Finite {
			sl.ExpiresAt = exp.Time.UTC()
		}
		out = append(out, sl)
	}
	return out, wrapErr(op, rows.Err())
}

// ShardAcquire implements outbox.ShardLeaser: one statement takes every
// listed shard that is free, expired or released.
func (l *ShardLeaser) ShardAcquire(ctx context.Context, p outbox.ShardAcquireParams) ([]outbox.ShardLease, error) {
	if len(p.Shards) == 0 {
		return nil, nil
	}
	rows, err := l.db.Query(ctx, `INSERT INTO `+l.leases+` AS l (shard, owner, epoch, expires_at)
		SELECT s, $1, 1, clock_timestamp() + $3::interval FROM unnest($2::text[]) s
		ON CONFLICT (shard) DO UPDATE SET owner = excluded.owner, epoch = l.epoch + 1, expires_at = excluded.expires_at
		WHERE l.expires_at <= clock_timestamp()
		RETURNING shard, owner, epoch, false, expires_at`, p.Member, p.Shards, p.TTL)
	if err != nil {
		return nil, wrapErr("shard acquire", err)
	}
	return scanLeases(rows, "shard acquire")
}

// ShardList implements outbox.ShardLeaser.
func (l *ShardLeaser) ShardList(ctx context.Context, _ outbox.ShardListParams) ([]outbox.ShardLease, error) {
	rows, err := l.db.Query(ctx, `SELECT shard, owner, epoch, expires_at <= clock_timestamp(), expires_at FROM `+l.leases+` ORDER BY shard`)
	if err != nil {
		return nil, wrapErr("shard list", err)
	}
	return scanLeases(rows, "shard list")
}

// ShardMembers implements outbox.ShardLeaser. Members whose heartbeat is
// an hour old are deleted on the way.
func (l *ShardLeaser) ShardMembers(ctx context.Context, p outbox.ShardMembersParams) ([]string, error) {
	if p.Leave {
		_, err := l.db.Exec(ctx, `DELETE FROM `+l.members+` WHERE member = $1`, p.Member)
		if err != nil {
			return nil, wrapErr("shard members", err)
		}
		p.Member = ""
	} else {
		_, err := l.db.Exec(ctx, `INSERT INTO `+l.members+` AS m (member, expires_at) VALUES ($1, clock_timestamp() + $2::interval)
			ON CONFLICT (member) DO UPDATE SET expires_at = excluded.expires_at`, p.Member, p.TTL)
		if err != nil {
			return nil, wrapErr("shard members", err)
		}
	}
	rows, err := l.db.Query(ctx, `WITH gone AS (DELETE FROM `+l.members+` WHERE expires_at < clock_timestamp() - interval '1 hour')
		SELECT member FROM `+l.members+` WHERE expires_at > clock_timestamp() OR member = $1 ORDER BY member`, p.Member)
	if err != nil {
		return nil, wrapErr("shard members", err)
	}
	members, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return members, wrapErr("shard members", err)
}

// ShardRelease implements outbox.ShardLeaser: the leases expire now (their
// epochs are kept, so the next acquisition counts on).
func (l *ShardLeaser) ShardRelease(ctx context.Context, p outbox.ShardReleaseParams) error {
	_, err := l.db.Exec(ctx, `UPDATE `+l.leases+` SET expires_at = '-infinity'
		WHERE owner = $1 AND shard = ANY($2::text[]) AND expires_at > clock_timestamp()`, p.Member, p.Shards)
	return wrapErr("shard release", err)
}

// ShardRenew implements outbox.ShardLeaser: a lease that already expired
// is not renewed, even when nobody took it since.
func (l *ShardLeaser) ShardRenew(ctx context.Context, p outbox.ShardRenewParams) ([]outbox.ShardLease, error) {
	if len(p.Shards) == 0 {
		return nil, nil
	}
	rows, err := l.db.Query(ctx, `UPDATE `+l.leases+` SET expires_at = clock_timestamp() + $3::interval
		WHERE owner = $1 AND shard = ANY($2::text[]) AND expires_at > clock_timestamp()
		RETURNING shard, owner, epoch, false, expires_at`, p.Member, p.Shards, p.TTL)
	if err != nil {
		return nil, wrapErr("shard renew", err)
	}
	return scanLeases(rows, "shard renew")
}

var _ outbox.ShardLeaser = (*ShardLeaser)(nil)
