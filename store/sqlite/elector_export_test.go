package sqlite

import "context"

// ElectorHeld reports whether an Elector of e's election leads in this
// process, for the tests.
func ElectorHeld(ctx context.Context, e *Elector) (bool, error) {
	key, err := e.key(ctx)
	if err != nil {
		return false, err
	}
	elections.Lock()
	defer elections.Unlock()
	el := elections.m[key]
	return el != nil && el.holder != nil, nil
}
