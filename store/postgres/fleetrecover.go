package postgres

import (
	"context"

	"github.com/outboxkit/outboxkit/outbox"
)

// MessageRecoverOrphans recovers every lease, whenever taken and by whom, as
// MessageRecover recovers the expired ones (outbox.OrphanRecoverer): an
// outbox.Fleet calls it when it took the database from an instance whose
// lease ended, before the database's processor starts, so the messages
// that instance claimed are published again at once rather than after
// ProcessingTimeout. Each goes back to PENDING with its claim token
// cleared, so a late outcome of the previous holder is refused, and on
// the append-only path its group gets a done mark, as after an expired
// lease (there, a lease taken more than 10 minutes ago is left to the
// processor's recovery: it has expired under any ProcessingTimeout up to
// that). It must not run while a processor works the store: it would take
// that processor's leases too.
func (s *Store) MessageRecoverOrphans(ctx context.Context, p outbox.MessageRecoverOrphansParams) (outbox.RecoverResult, error) {
	if err := p.Validate(); err != nil {
		return outbox.RecoverResult{}, err
	}
	return s.recoverWith(ctx, s.recoverSpec(p.RecoverParams()), s.logRecoverOrphans)
}

// logRecoverOrphans is MessageRecoverOrphans's part on the append-only
// path: every group whose latest mark is a lease written since
// logRecoverAll (and logRecoverMargin, for a writer's clock behind) before
// now. It runs before a database's first claim, so it reads only the
// recent lease marks, not all of them: an older lease is past any
// ProcessingTimeout up to 10 minutes, and the processor's first recovery,
// which reads them all, takes it soon after. It leaves the expired-lease
// recovery's cutoff alone: logRecoverLeases would move it to the cutoff it
// was given, here in the year 9999, and the expired leases would then wait
// for its next full scan.
func (s *Store) logRecoverOrphans(ctx context.Context, r recoverArgs) (outbox.RecoverResult, error) {
	return s.logRecoverRange(ctx, r, r.now.Add(-logRecoverAll-logRecoverMargin))
}
