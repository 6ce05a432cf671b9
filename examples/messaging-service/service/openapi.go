package service

import _ "embed"

// openAPI is the OpenAPI 3 description served at /api/v1/openapi.json. A
// test checks it against the mux: every documented operation is routed and
// every route is documented.
//
//go:embed openapi.json
var openAPI []byte
