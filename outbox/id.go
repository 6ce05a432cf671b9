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
