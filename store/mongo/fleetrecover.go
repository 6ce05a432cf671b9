package mongo

import (
	"context"

	"github.com/outboxkit/outboxkit/outbox"
)

// MessageRecoverOrphans implements outbox.OrphanRecoverer: MessageRecover
// for every PROCESSING message, whenever claimed and by whom (at most
// 10,000 a call, as MessageRecover), each fenced and written as
// MessageRecover writes it. An outbox.Fleet calls it when it took the
// database from an instance whose lease ended, before the database's
// processor starts; it must not run while a processor works the store.
func (s *Store) MessageRecoverOrphans(ctx context.Context, p outbox.MessageRecoverOrphansParams) (outbox.RecoverResult, error) {
	if err := p.Validate(); err != nil {
		return outbox.RecoverResult{}, err
	}
	return s.MessageRecover(ctx, p.RecoverParams())
}
