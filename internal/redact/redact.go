// Package redact keeps secrets and unprintable bytes out of the errors and
// logs of the publishers (transport/*, flowcatalyst, whatsapp).
package redact

import (
	"bytes"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Placeholder replaces a secret.
const Placeholder = "[redacted]"

// minSecret is the shortest secret replaced: shorter ones would blank out
// ordinary text.
const minSecret = 4

// Secrets replaces every secret of at least four bytes in s with
// Placeholder (a server may echo a token back).
func Secrets(s string, secrets ...string) string {
	for _, secret := range secrets {
		if len(secret) >= minSecret {
			s = strings.ReplaceAll(s, secret, Placeholder)
		}
	}
	return s
}

// SecretsBytes is Secrets for a byte slice; b is returned as is when it
// holds no secret.
func SecretsBytes(b []byte, secrets ...string) []byte {
	for _, secret := range secrets {
		if len(secret) >= minSecret && bytes.Contains(b, []byte(secret)) {
			b = bytes.ReplaceAll(b, []byte(secret), []byte(Placeholder))
		}
	}
	return b
}

// Printable returns s as valid UTF-8 with control characters turned into
// spaces, trimmed, and cut to at most n bytes (on a rune boundary, marked
// with "…").
func Printable(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	s = strings.TrimSpace(s)
	if len(s) > n {
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s = s[:n] + "…"
	}
	return s
}
