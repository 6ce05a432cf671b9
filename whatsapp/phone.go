package whatsapp

import (
	"errors"
	"strings"
)

// ErrInvalidPhone is returned by NormalizePhone for a string that is not a
// phone number.
var ErrInvalidPhone = errors.New("whatsapp: invalid phone number")

// NormalizePhone returns phone as "+" and digits (E.164), the form Meta
// recommends for "to": spaces, dashes, dots and parentheses are removed and
// a leading "00" becomes "+". A number without "+" or "00" is taken to
// include its country code already (webhooks carry wa_id that way): "+" is
// prepended. Meta would otherwise prepend the business number's own country
// code, which silently sends to the wrong number. A result must have 7 to 15
// digits.
func NormalizePhone(phone string) (string, error) {
	s := strings.TrimSpace(phone)
	var b strings.Builder
	b.Grow(len(s) + 1)
	plus := false
	for i, r := range s {
		switch {
		case r >= '0' && r <= '9':
			b.WriteRune(r)
		case r == '+' && i == 0:
			plus = true
		case r == ' ' || r == '-' || r == '.' || r == '(' || r == ')' || r == '\t':
		default:
			return "", ErrInvalidPhone
		}
	}
	d := b.String()
	if !plus && strings.HasPrefix(d, "00") {
		d = d[2:]
	}
	if len(d) < 7 || len(d) > 15 || d[0] == '0' {
		return "", ErrInvalidPhone
	}
	return "+" + d, nil
}
