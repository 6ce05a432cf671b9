package service_test

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestOpenAPILint lints openapi.json with Redocly's recommended rules: no
// error and no warning (operationIds for generated clients, servers, a
// license, a 4xx per operation ...). It needs the redocly command (npm
// install -g @redocly/cli, which .ci/run does); without it the test skips,
// except under OUTBOXKIT_REQUIRE_BACKENDS=1 (CI), where it fails.
func TestOpenAPILint(t *testing.T) {
	t.Parallel()
	bin, err := exec.LookPath("redocly")
	if err != nil {
		if os.Getenv("OUTBOXKIT_REQUIRE_BACKENDS") == "1" {
			t.Fatal("redocly is not installed (npm install -g @redocly/cli@2.77.0)")
		}
		t.Skip("redocly is not installed (npm install -g @redocly/cli@2.77.0)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "lint", "--extends=recommended", "openapi.json")
	cmd.Env = append(os.Environ(), "REDOCLY_TELEMETRY=off", "REDOCLY_SUPPRESS_UPDATE_NOTICE=true", "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	text := string(out)
	// (Node's own deprecation notices also say "warning": look for
	// Redocly's count of problems.)
	if err != nil || !strings.Contains(text, "Your API description is valid") || regexp.MustCompile(`(?i)you have \d+ warning`).MatchString(text) {
		t.Fatalf("redocly lint --extends=recommended openapi.json: %v\n%s", err, text)
	}
}
