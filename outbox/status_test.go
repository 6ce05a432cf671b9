package outbox

import (
	"errors"
	"testing"
)

// TestTransitionTable checks every (status, event) pair against the diagram
// in DESIGN.md / docs/state_machine.md, row by row.
func TestTransitionTable(t *testing.T) {
	t.Parallel()
	const invalid Status = ""
	want := map[Status]map[Event]Status{
		StatusPending: {
			EventClaim: StatusProcessing, EventCancel: StatusCancelled,
		},
		StatusProcessing: {
			EventPublished: StatusSent, EventRetry: StatusPending, EventDeadLetter: StatusFailed,
			EventRelease: StatusPending, EventLeaseExpired: StatusPending,
		},
		StatusSent: {
			EventReceiptSent: StatusSent, EventReceiptDelivered: StatusDelivered,
			EventReceiptRead: StatusDelivered, EventReceiptFailed: StatusFailed,
		},
		StatusDelivered: {
			EventReceiptSent: StatusDelivered, EventReceiptDelivered: StatusDelivered, EventReceiptRead: StatusDelivered,
		},
		StatusFailed:    {EventRequeue: StatusPending, EventCancel: StatusCancelled},
		StatusCancelled: {},
	}
	for _, from := range Statuses() {
		for _, ev := range Events() {
			exp, ok := want[from][ev]
			if !ok {
				exp = invalid
			}
			got, err := Transition(from, ev)
			if exp == invalid {
				if !errors.Is(err, ErrInvalidTransition) {
					t.Errorf("%s --%s--> %s, want ErrInvalidTransition", from, ev, got)
				}
				if got != from {
					t.Errorf("%s --%s--> refused but returned %s, want the unchanged status", from, ev, got)
				}
				continue
			}
			if err != nil || got != exp {
				t.Errorf("%s --%s--> %s, %v; want %s", from, ev, got, err, exp)
			}
		}
	}
}

func TestTerminalAndNoDowngrade(t *testing.T) {
	t.Parallel()
	for _, ev := range Events() {
		if to, err := Transition(StatusCancelled, ev); err == nil {
			t.Errorf("CANCELLED is terminal but %s moves it to %s", ev, to)
		}
		if to, err := Transition(StatusFailed, ev); err == nil && ev != EventRequeue && ev != EventCancel {
			t.Errorf("FAILED leaves only by requeue or cancel, but %s moves it to %s", ev, to)
		}
		if to, err := Transition(StatusDelivered, ev); err == nil && to != StatusDelivered {
			t.Errorf("DELIVERED must never go back, %s moves it to %s", ev, to)
		}
	}
}

func TestStatusHelpers(t *testing.T) {
	t.Parallel()
	if len(Statuses()) != 6 {
		t.Fatalf("Statuses() = %v", Statuses())
	}
	for _, s := range Statuses() {
		if !s.Valid() {
			t.Errorf("%s not valid", s)
		}
	}
	if Status("QUEUED").Valid() || Status("").Valid() {
		t.Error("unknown statuses must not be valid")
	}
	finished := map[Status]bool{StatusSent: true, StatusDelivered: true, StatusFailed: true, StatusCancelled: true}
	for _, s := range Statuses() {
		if s.Finished() != finished[s] {
			t.Errorf("%s.Finished() = %v", s, s.Finished())
		}
	}
}
