package whatsapp

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
)

// SignatureHeader is the header carrying the webhook signature.
const SignatureHeader = "X-Hub-Signature-256"

// Signature errors returned by VerifySignature.
var (
	// ErrSignatureMissing: the request has no X-Hub-Signature-256.
	ErrSignatureMissing = errors.New("whatsapp: webhook signature missing")
	// ErrSignatureInvalid: the signature is malformed or does not match.
	ErrSignatureInvalid = errors.New("whatsapp: webhook signature invalid")
)

// Sign returns the X-Hub-Signature-256 value of body for appSecret:
// "sha256=" and the lowercase hex HMAC-SHA256.
func Sign(body []byte, appSecret string) string {
	m := hmac.New(sha256.New, []byte(appSecret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// VerifySignature checks header (the X-Hub-Signature-256 value) against the
// HMAC-SHA256 of the raw body bytes keyed with appSecret, in constant time.
// It returns ErrSignatureMissing for an empty header and
// ErrSignatureInvalid for a malformed or wrong one or an empty secret.
func VerifySignature(body []byte, header, appSecret string) error {
	if header == "" {
		return ErrSignatureMissing
	}
	hexSig, ok := strings.CutPrefix(header, "sha256=")
	if !ok || len(hexSig) != sha256.Size*2 || appSecret == "" {
		return ErrSignatureInvalid
	}
	got, err := hex.DecodeString(hexSig)
	if err != nil {
		return ErrSignatureInvalid
	}
	m := hmac.New(sha256.New, []byte(appSecret))
	m.Write(body)
	if !hmac.Equal(got, m.Sum(nil)) {
		return ErrSignatureInvalid
	}
	return nil
}
