package outbox

import (
	"crypto/rand"
	"encoding/binary"
	"sync"
	"time"
)

const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

var idGen struct {
	sync.Mutex
	lastMS  uint64
	entropy [10]byte
}

// NewID returns a new ULID for time t: 26 Crockford Base32 characters, 48
// bits of milliseconds then 80 random bits. IDs made in the same millisecond
// by this process are strictly increasing (the random part is incremented),
// so IDs sort in creation order within a process.
func NewID(t time.Time) string {
	ms := uint64(t.UnixMilli())
	idGen.Lock()
	if ms <= idGen.lastMS {
		ms = idGen.lastMS
		// increment the 80-bit entropy
		for i := len(idGen.entropy) - 1; i >= 0; i-- {
			idGen.entropy[i]++
			if idGen.entropy[i] != 0 {
				break
			}
		}
	} else {
		idGen.lastMS = ms
		_, _ = rand.Read(idGen.entropy[:])
		idGen.entropy[0] &= 0x7f // leave room to increment
	}
	var b [16]byte
	binary.BigEndian.PutUint16(b[0:2], uint16(ms>>32))
	binary.BigEndian.PutUint32(b[2:6], uint32(ms))
	copy(b[6:], idGen.entropy[:])
	idGen.Unlock()
	return encodeULID(b)
}

func encodeULID(b [16]byte) string {
	// 128 bits -> 26 chars, first char carries 3 bits.
	var out [26]byte
	hi := binary.BigEndian.Uint64(b[0:8])
	lo := binary.BigEndian.Uint64(b[8:16])
	for i := 25; i >= 0; i-- {
		out[i] = crockford[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
	return string(out[:])
}
