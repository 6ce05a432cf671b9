package outbox

import (
	"math/rand/v2"
	"time"
)

// DefaultSchedule is the retry schedule of the seed systems: after the first
// failed attempt wait 1 minute, then 5, 15, 60 and 360 minutes.
var DefaultSchedule = []time.Duration{
	1 * time.Minute, 5 * time.Minute, 15 * time.Minute, 60 * time.Minute, 360 * time.Minute,
}

// DefaultMaxAttempts is the number of publish attempts before a message is
// dead-lettered: the first attempt plus one retry per step of
// DefaultSchedule (0, +1, +5, +15, +60, +360 minutes), as in the seed's
// timeline.
const DefaultMaxAttempts = 6

// Backoff computes the delay before the next attempt.
type Backoff struct {
	// Schedule holds the delay after failed attempt 1, 2, ...; attempts past
	// its end reuse the last entry. Defaults to DefaultSchedule.
	Schedule []time.Duration
	// Jitter, between 0 and 1, spreads each delay uniformly over
	// [d*(1-Jitter), d*(1+Jitter)]. Defaults to 0 (exact schedule).
	Jitter float64
}

// Delay returns the wait after failed attempt number attempt (1-based). A
// positive retryAfter (a provider's Retry-After) wins over the schedule.
func (b Backoff) Delay(attempt int, retryAfter time.Duration) time.Duration {
	if retryAfter > 0 {
		return retryAfter
	}
	s := b.Schedule
	if len(s) == 0 {
		s = DefaultSchedule
	}
	if attempt < 1 {
		attempt = 1
	}
	i := attempt - 1
	if i >= len(s) {
		i = len(s) - 1
	}
	d := s[i]
	if b.Jitter > 0 && d > 0 {
		j := b.Jitter
		if j > 1 {
			j = 1
		}
		f := 1 - j + 2*j*rand.Float64() //nolint:gosec // jitter needs no crypto
		d = time.Duration(float64(d) * f)
	}
	return d
}

// Next returns what happens after failed attempt number attempt of a
// message allowed maxAttempts attempts: retry at now+delay, or dead-letter
// (retry = false) when the error is permanent or attempts are exhausted.
func (b Backoff) Next(now time.Time, attempt, maxAttempts int, permanent bool, retryAfter time.Duration) (at time.Time, retry bool) {
	if permanent || attempt >= maxAttempts {
		return time.Time{}, false
	}
	return now.Add(b.Delay(attempt, retryAfter)), true
}
