package service

import (
	"bytes"
	_ "embed"
)

// openAPI is the OpenAPI 3 description served at /api/v1/openapi.json. A
// test checks it against the mux: every documented operation is routed and
// every route is documented; the black-box tests check every response
// they get against it.
//
//go:embed openapi.json
var openAPI []byte

// OpenAPI returns a copy of the service's OpenAPI 3 document (JSON), the
// one served at /api/v1/openapi.json.
func OpenAPI() []byte { return bytes.Clone(openAPI) }
