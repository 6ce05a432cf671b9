package flowcatalyst

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/outboxkit/outboxkit/outbox"
)

// TSID is a time-sorted 64-bit identifier, written as 13 characters of
// Crockford Base32 ("0HZXEQ5Y8JY5Z"). FlowCatalyst uses raw TSIDs as the ids
// of outbox rows (VARCHAR(13)) and as the untyped part of its typed ids
// ("clt_0HZXEQ5Y8JY5Z").
//
// Layout, most significant bit first, as in FlowCatalyst's Go SDK:
//
//	bits 63..22  milliseconds since the Unix epoch (42 bits, until 2109)
//	bits 21..10  counter (12 bits): starts at a random value each
//	             millisecond and increments within it
//	bits  9..0   random (10 bits), fresh for every id
//
// Because the counter sits above the random bits and Crockford Base32
// preserves order, the ids one generator makes sort, as strings and as
// numbers, in the order they were made. (The seed's Java generator,
// tsid-creator, counts milliseconds from 2020-01-01 instead; ids from both
// are unique but do not sort against each other. The seed orders by
// created_at, not by id, so mixing them in one table is harmless.)
type TSID uint64

// TSIDLen is the length of a TSID's string form.
const TSIDLen = 13

const (
	tsidRandomBits  = 10
	tsidCounterBits = 12
	tsidTimeBits    = 42
	tsidCounterMask = 1<<tsidCounterBits - 1
	tsidRandomMask  = 1<<tsidRandomBits - 1
	tsidTimeMask    = 1<<tsidTimeBits - 1
)

// ErrInvalidTSID is matched (errors.Is) by the error ParseTSID returns for a
// string that is not a TSID.
var ErrInvalidTSID = errors.New("flowcatalyst: invalid TSID")

const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// crockfordValue maps a byte to its Crockford value, or 0xFF. Lower case is
// accepted; I, L, O and U are not (FlowCatalyst never writes them).
var crockfordValue = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xFF
	}
	for i := 0; i < len(crockford); i++ {
		c := crockford[i]
		t[c] = byte(i)
		if c >= 'A' && c <= 'Z' {
			t[c+'a'-'A'] = byte(i)
		}
	}
	return t
}()

// String returns the 13-character Crockford Base32 form of id.
func (id TSID) String() string {
	var b [TSIDLen]byte
	v := uint64(id)
	for i := TSIDLen - 1; i >= 0; i-- {
		b[i] = crockford[v&31]
		v >>= 5
	}
	return string(b[:])
}

// Time returns the millisecond id was made at (UTC).
func (id TSID) Time() time.Time {
	return time.UnixMilli(int64(uint64(id) >> (tsidCounterBits + tsidRandomBits))).UTC()
}

// Counter returns id's 12-bit counter.
func (id TSID) Counter() int { return int(uint64(id) >> tsidRandomBits & tsidCounterMask) }

// Random returns id's 10 random bits.
func (id TSID) Random() int { return int(uint64(id) & tsidRandomMask) }

// MarshalText implements encoding.TextMarshaler (the 13-character form).
func (id TSID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseTSID.
func (id *TSID) UnmarshalText(b []byte) error {
	v, err := ParseTSID(string(b))
	if err != nil {
		return err
	}
	*id = v
	return nil
}

// ParseTSID parses the 13-character form of a TSID (upper or lower case).
// Any other input returns an error matching ErrInvalidTSID.
func ParseTSID(s string) (TSID, error) {
	if len(s) != TSIDLen {
		return 0, fmt.Errorf("%w: %d characters, want %d", ErrInvalidTSID, len(s), TSIDLen)
	}
	var v uint64
	for i := 0; i < len(s); i++ {
		d := crockfordValue[s[i]]
		if d == 0xFF {
			return 0, fmt.Errorf("%w: character %d is not Crockford Base32", ErrInvalidTSID, i+1)
		}
		if i == 0 && d > 15 { // 13 characters hold 65 bits; the first carries 4
			return 0, fmt.Errorf("%w: out of range (the first character must be 0-F)", ErrInvalidTSID)
		}
		v = v<<5 | uint64(d)
	}
	return TSID(v), nil
}

// TSIDGenerator makes TSIDs that strictly increase within the generator:
// inside one millisecond the counter increments; when 4,096 ids have been
// made in one millisecond the generator borrows the next millisecond rather
// than reuse a counter value; and a clock that steps backwards does not make
// ids go backwards (the generator keeps issuing from its latest
// millisecond). It is safe for concurrent use.
type TSIDGenerator struct {
	clock outbox.Clock

	mu      sync.Mutex
	lastMS  uint64
	counter uint64
}

// NewTSIDGenerator returns a generator reading clock (nil means the system
// clock).
func NewTSIDGenerator(clock outbox.Clock) *TSIDGenerator {
	if clock == nil {
		clock = outbox.SystemClock
	}
	return &TSIDGenerator{clock: clock}
}

// New returns the next TSID.
func (g *TSIDGenerator) New() TSID {
	now := uint64(g.clock.Now().UnixMilli()) & tsidTimeMask
	g.mu.Lock()
	switch {
	case now > g.lastMS:
		g.lastMS, g.counter = now, randomBits(tsidCounterBits)
	case g.counter < tsidCounterMask:
		g.counter++
	default:
		g.lastMS, g.counter = g.lastMS+1, randomBits(tsidCounterBits)
	}
	ms, counter := g.lastMS, g.counter
	g.mu.Unlock()
	return TSID(ms<<(tsidCounterBits+tsidRandomBits) | counter<<tsidRandomBits | randomBits(tsidRandomBits))
}

var defaultTSIDs = NewTSIDGenerator(nil)

// NewTSID returns a TSID from the process-wide generator: ids made by one
// process strictly increase.
func NewTSID() TSID { return defaultTSIDs.New() }

// randomBits returns n (<= 16) random bits. A failing crypto/rand (it does
// not fail on supported platforms) falls back to the clock's nanoseconds:
// the counter still keeps ids of this process unique.
func randomBits(n uint) uint64 {
	var b [2]byte
	if _, err := rand.Read(b[:]); err != nil {
		return uint64(time.Now().UnixNano()) & (1<<n - 1)
	}
	return uint64(binary.BigEndian.Uint16(b[:])) & (1<<n - 1)
}
