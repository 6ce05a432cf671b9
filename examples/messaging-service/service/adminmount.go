package service

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net/http"
	"strings"

	"github.com/outboxkit/outboxkit/outbox/admin"
)

// errNotOperator is the admin API's refusal of a request without the
// admin token.
var errNotOperator = errors.New("the admin API needs the operator's token")

// operatorKey marks, in a request's context, that mountAdmin's handler
// found the admin token on it.
type operatorKey struct{}

// mountAdmin serves outbox/admin under AdminPath to requests that carry
// the admin token, as a bearer token (scripts) or as the password of HTTP
// Basic authentication (a browser asks for it: the refusal says Basic).
// The token is checked once, by the handler in front of the admin's; the
// admin's Authorize accepts only the requests that handler marked.
// Its operator actions (requeues, cancels, pauses) go to the service's log.
func (s *Service) mountAdmin() error {
	want := sha256.Sum256([]byte(s.cfg.AdminToken))
	operator := func(r *http.Request) bool {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			_, tok, ok = r.BasicAuth()
		}
		got := sha256.Sum256([]byte(tok))
		return ok && subtle.ConstantTimeCompare(got[:], want[:]) == 1
	}
	h, err := admin.New(admin.Config{
		Store:  s.store,
		Logger: s.log,
		Authorize: func(r *http.Request) error {
			if r.Context().Value(operatorKey{}) != true {
				return errNotOperator
			}
			return nil
		},
	})
	if err != nil {
		return err
	}
	inner := http.StripPrefix(strings.TrimSuffix(AdminPath, "/"), h)
	s.mux.Handle(AdminPath, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !operator(r) {
			w.Header().Set("WWW-Authenticate", `Basic realm="outboxkit admin", charset="UTF-8"`)
			writeError(w, http.StatusUnauthorized, "unauthorized", errNotOperator.Error())
			return
		}
		inner.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), operatorKey{}, true)))
	}))
	return nil
}
