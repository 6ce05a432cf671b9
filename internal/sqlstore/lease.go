package sqlstore

import (
	"context"
	"database/sql"

	"github.com/outboxkit/outboxkit/outbox"
)

// extendChunk is how many leases one statement of MessageExtendLease
// names (bound parameters stay far below every database's limit).
const extendChunk = 500

// MessageExtendLease is the stores' MessageExtendLease: its documentation is on store/mysql.Store
// and store/sqlite.Store.
func (s *Store) MessageExtendLease(ctx context.Context, p outbox.MessageExtendLeaseParams) (outbox.ExtendLeaseResult, error) {
	var res outbox.ExtendLeaseResult
	if err := p.Validate(); err != nil {
		return res, err
	}
	if len(p.Leases) == 0 {
		return res, nil
	}
	now := s.syntax.Time(s.now(p.Now))
	held := make(map[string]bool, len(p.Leases))
	err := s.dialect.WriteTx(ctx, func(q Querier) error {
		clear(held)
		for start := 0; start < len(p.Leases); start += extendChunk {
			part := p.Leases[start:min(start+extendChunk, len(p.Leases))]
			want := make(map[string]outbox.Lease, len(part))
			args := []any{p.Owner}
			for _, l := range part {
				want[l.ID] = l
				args = append(args, l.ID)
			}
			var seqs []any
			err := scanRows(ctx, q, `SELECT seq, id, attempts, claim_token FROM `+s.messages+`
				WHERE status = 'PROCESSING' AND claimed_by = ? AND id IN (`+Placeholders(len(part))+`)`+s.syntax.ForUpdate,
				args, func(rows *sql.Rows) error {
					var seq int64
					var id string
					var attempts int
					var token sql.NullString
					if err := rows.Scan(&seq, &id, &attempts, &token); err != nil {
						return err
					}
					if l, ok := want[id]; ok && l.Attempt == attempts && l.ClaimToken == token.String {
						held[id] = true
						seqs = append(seqs, seq)
					}
					return nil
				})
			if err != nil || len(seqs) == 0 {
				return err
			}
			if _, err := q.ExecContext(ctx, `UPDATE `+s.messages+` SET claimed_at = ?
				WHERE status = 'PROCESSING' AND seq IN (`+Placeholders(len(seqs))+`)`,
				append([]any{now}, seqs...)...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return res, s.errorf("extend lease", err)
	}
	for _, l := range p.Leases {
		if !held[l.ID] {
			res.LeaseLost = append(res.LeaseLost, l.ID)
		}
	}
	return res, nil
}
