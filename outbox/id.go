package outbox

import (
	"crypto/rand"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
)

var idGen struct {
	sync.Mutex
	lastMS  uint64
	entropy *ulid.MonotonicEntropy
}

// NewID returns a new ULID for time t (github.com/oklog/ulid/v2): 26
// Crockford Base32 characters, 48 bits of milliseconds then 80 random bits.
// IDs made by this process are strictly increasing, also within one
// millisecond (the random part is incremented) and when the clock steps
// back (the last millisecond is reused), so IDs sort in creation order
// within a process.
func NewID(t time.Time) string {
	ms := uint64(max(t.UnixMilli(), 0))
	idGen.Lock()
	defer idGen.Unlock()
	if idGen.entropy == nil {
		idGen.entropy = ulid.Monotonic(rand.Reader, 0)
	}
	ms = max(ms, idGen.lastMS)
	for {
		id, err := ulid.New(ms, idGen.entropy)
		if err == nil {
			idGen.lastMS = ms
			return id.String()
		}
		// The increments of this millisecond are used up (about 2^48
		// IDs): go on in the next one.
		ms++
	}
}

// crockford is the ULID alphabet (Crockford's base32, upper case).
const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// ValidID reports whether s is a ULID in canonical form: 26 upper-case
// Crockford base32 characters, the first at most '7' (128 bits). Lower case,
// though ULID parsers accept it, is refused: IDs are compared and sorted as
// strings.
func ValidID(s string) bool {
	if len(s) != 26 || s[0] > '7' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(crockford, s[i]) < 0 {
			return false
		}
	}
	return true
}

// NewClaimToken returns a new claim token (see Message.ClaimToken): a
// random (version 4) UUID in its canonical text form, 36 characters. Stores
// that make their tokens in Go call it once per claimed message; a store
// may make them otherwise (PostgreSQL's gen_random_uuid makes the same
// form), as long as no two claims of a message share one.
func NewClaimToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	const hexd = "0123456789abcdef"
	out := make([]byte, 0, 36)
	for i, c := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out = append(out, '-')
		}
		out = append(out, hexd[c>>4], hexd[c&0x0f])
	}
	return string(out)
}
