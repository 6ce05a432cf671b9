package whatsapp

import (
	"context"
	"errors"
	"fmt"
)

// ErrUnknownTenant is returned (wrapped) by a CredentialsProvider that has no
// credentials for a tenant or phone number ID.
var ErrUnknownTenant = errors.New("whatsapp: unknown tenant")

// Credentials are one tenant's WhatsApp Cloud API settings. They are
// secrets: this package never logs them or puts them in errors.
type Credentials struct {
	// PhoneNumberID is the business phone number's ID, the path segment of
	// the send endpoint and the webhook's metadata.phone_number_id.
	PhoneNumberID string
	// AccessToken is the bearer token for the Cloud API.
	AccessToken string
	// AppSecret keys the webhook signature (X-Hub-Signature-256). Empty means
	// WebhookConfig.AppSecret.
	AppSecret string
	// VerifyToken is compared with hub.verify_token on the webhook's GET
	// verification.
	VerifyToken string
}

// String hides the secrets, so a Credentials value printed by mistake leaks
// nothing.
func (c Credentials) String() string {
	return fmt.Sprintf("whatsapp.Credentials{PhoneNumberID: %q, AccessToken: [redacted], AppSecret: [redacted], VerifyToken: [redacted]}", c.PhoneNumberID)
}

// GoString hides the secrets from %#v.
func (c Credentials) GoString() string { return c.String() }

// CredentialsProvider gives each tenant's credentials. The host implements
// it over its own configuration or secret store (credentials may be kept
// encrypted and decrypted here). Both methods wrap ErrUnknownTenant when the
// tenant or phone number is not known; other errors are treated as
// temporary.
type CredentialsProvider interface {
	// Credentials returns the credentials of tenant ("" for a single-tenant
	// service).
	Credentials(ctx context.Context, tenant string) (Credentials, error)
	// TenantByPhoneNumberID returns the tenant that owns a business phone
	// number ID; the webhook routes notifications with it.
	TenantByPhoneNumberID(ctx context.Context, phoneNumberID string) (string, error)
}

// StaticCredentials is a CredentialsProvider over a fixed map from tenant to
// credentials.
type StaticCredentials map[string]Credentials

// Credentials returns s[tenant] or an error wrapping ErrUnknownTenant.
func (s StaticCredentials) Credentials(_ context.Context, tenant string) (Credentials, error) {
	c, ok := s[tenant]
	if !ok {
		return Credentials{}, fmt.Errorf("%w: %q", ErrUnknownTenant, tenant)
	}
	return c, nil
}

// TenantByPhoneNumberID returns the tenant whose PhoneNumberID is id, or an
// error wrapping ErrUnknownTenant.
func (s StaticCredentials) TenantByPhoneNumberID(_ context.Context, id string) (string, error) {
	if id != "" {
		for t, c := range s {
			if c.PhoneNumberID == id {
				return t, nil
			}
		}
	}
	return "", fmt.Errorf("%w: phone number id %q", ErrUnknownTenant, id)
}
