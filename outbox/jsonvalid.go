package outbox

import "unicode/utf8"

// maxJSONDepth is encoding/json's nesting limit (scanner.go, maxNestingDepth):
// 10,000 nested arrays or objects are valid, 10,001 are not.
const maxJSONDepth = 10000

// jsonPlain marks the bytes a string may hold with no further look: printable
// ASCII but the quote and the backslash (not control characters, and not
// the bytes of multi-byte UTF-8 sequences, which are decoded).
var jsonPlain = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func jsonSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func jsonSkipSpace(b []byte, i int) int {
	for i < len(b) && jsonSpace(b[i]) {
		i++
	}
	return i
}

// validJSON reports whether b is one JSON value, optionally surrounded by
// white space, with valid UTF-8 throughout: exactly what utf8.Valid(b) &&
// json.Valid(b) report (encoding/json's grammar and its nesting limit), in
// one pass and at about a third of their cost. Every JSON payload is
// checked before it reaches a database, so a bad one gets a typed error
// instead of aborting the caller's transaction; on the enqueue path the
// two standard checks were a tenth of the client's CPU.
func validJSON(b []byte) bool {
	// The open containers, innermost last: true for an object. Most
	// documents nest a few levels; the array keeps them off the heap.
	var buf [32]bool
	stack := buf[:0]
	i := jsonSkipSpace(b, 0)
	for {
		// A value starts at i.
		if i >= len(b) {
			return false
		}
		switch c := b[i]; {
		case c == '{' || c == '[':
			if len(stack) == maxJSONDepth {
				return false
			}
			obj := c == '{'
			i = jsonSkipSpace(b, i+1)
			if i < len(b) && ((obj && b[i] == '}') || (!obj && b[i] == ']')) {
				i++
				break
			}
			stack = append(stack, obj)
			if obj {
				var ok bool
				if i, ok = jsonKey(b, i); !ok {
					return false
				}
			}
			continue
		case c == '"':
			var ok bool
			if i, ok = jsonString(b, i); !ok {
				return false
			}
		case c == '-' || (c >= '0' && c <= '9'):
			var ok bool
			if i, ok = jsonNumber(b, i); !ok {
				return false
			}
		case c == 't':
			if !jsonLit(b, i, "true") {
				return false
			}
			i += 4
		case c == 'f':
			if !jsonLit(b, i, "false") {
				return false
			}
			i += 5
		case c == 'n':
			if !jsonLit(b, i, "null") {
				return false
			}
			i += 4
		default:
			return false
		}
		// A value ended before i: close containers, or go on to the
		// next element.
		for {
			i = jsonSkipSpace(b, i)
			if len(stack) == 0 {
				return i == len(b)
			}
			if i >= len(b) {
				return false
			}
			obj := stack[len(stack)-1]
			c := b[i]
			if c == ',' {
				i = jsonSkipSpace(b, i+1)
				if obj {
					var ok bool
					if i, ok = jsonKey(b, i); !ok {
						return false
					}
				}
				break
			}
			if (obj && c == '}') || (!obj && c == ']') {
				stack = stack[:len(stack)-1]
				i++
				continue
			}
			return false
		}
	}
}

// jsonKey reads an object's key at i, the colon after it and the white space
// around it: i is then at the member's value.
func jsonKey(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return i, false
	}
	i, ok := jsonString(b, i)
	if !ok {
		return i, false
	}
	i = jsonSkipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return i, false
	}
	return jsonSkipSpace(b, i+1), true
}

func jsonLit(b []byte, i int, s string) bool {
	return len(b)-i >= len(s) && string(b[i:i+len(s)]) == s
}

// jsonString reads the string whose opening quote is at i and returns the index
// after its closing quote.
func jsonString(b []byte, i int) (int, bool) {
	i++
	for i < len(b) {
		c := b[i]
		if jsonPlain[c] {
			i++
			continue
		}
		switch {
		case c == '"':
			return i + 1, true
		case c == '\\':
			if i+1 >= len(b) {
				return i, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if len(b)-i < 6 || !jsonHex(b[i+2]) || !jsonHex(b[i+3]) || !jsonHex(b[i+4]) || !jsonHex(b[i+5]) {
					return i, false
				}
				i += 6
			default:
				return i, false
			}
		case c < 0x20:
			return i, false
		default: // c >= 0x80: a multi-byte UTF-8 sequence
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n == 1 {
				return i, false
			}
			i += n
		}
	}
	return i, false
}

func jsonHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// jsonNumber reads the number at i (encoding/json's grammar: an optional
// minus, 0 or a digit string without a leading zero, an optional fraction,
// an optional exponent) and returns the index after it.
func jsonNumber(b []byte, i int) (int, bool) {
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = jsonDigits(b, i+1)
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		j := jsonDigits(b, i+1)
		if j == i+1 {
			return i, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := jsonDigits(b, i)
		if j == i {
			return i, false
		}
		i = j
	}
	return i, true
}

func jsonDigits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}
