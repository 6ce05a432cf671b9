package outbox

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// allowedImports are the only modules outside the standard library the
// core may import: small, dependency-free libraries.
var allowedImports = map[string]bool{"github.com/oklog/ulid/v2": true}

// TestCoreImportsStdlibOnly keeps the core free of drivers and adapters:
// every non-test file imports the standard library only, and
// allowedImports.
func TestCoreImportsStdlibOnly(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			p := strings.Trim(imp.Path.Value, `"`)
			if first := strings.Split(p, "/")[0]; strings.Contains(first, ".") && !allowedImports[p] {
				t.Errorf("%s imports %s: the core must import the standard library only", f, p)
			}
		}
	}
}
