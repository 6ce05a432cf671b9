package migrations

import (
	"strings"
	"testing"
	"testing/fstest"
)

func TestLoad(t *testing.T) {
	t.Parallel()
	fsys := fstest.MapFS{
		"m/002_more.up.sql":   {Data: []byte("up2")},
		"m/002_more.down.sql": {Data: []byte("down2")},
		"m/001_init.up.sql":   {Data: []byte("up1")},
		"m/001_init.down.sql": {Data: []byte("down1")},
	}
	got, err := Load(fsys, "m")
	if err != nil || len(got) != 2 || got[0].Version != 1 || got[0].Name != "init" || got[1].Up != "up2" || got[1].Down != "down2" {
		t.Fatalf("%+v %v", got, err)
	}
	for name, bad := range map[string]fstest.MapFS{
		"no down":    {"m/001_a.up.sql": {Data: []byte("x")}},
		"no version": {"m/init.up.sql": {Data: []byte("x")}},
		"bad suffix": {"m/001_a.sql": {Data: []byte("x")}},
		"version 0":  {"m/000_a.up.sql": {Data: []byte("x")}, "m/000_a.down.sql": {Data: []byte("x")}},
		// Two migrations numbered alike: the second would never run.
		"two named alike": {"m/007_a.up.sql": {Data: []byte("x")}, "m/007_a.down.sql": {Data: []byte("x")},
			"m/007_b.up.sql": {Data: []byte("y")}, "m/007_b.down.sql": {Data: []byte("y")}},
		"an up and a down named apart": {"m/007_a.up.sql": {Data: []byte("x")}, "m/007_b.down.sql": {Data: []byte("x")}},
	} {
		if _, err := Load(bad, "m"); err == nil || !strings.Contains(err.Error(), "migration") {
			t.Errorf("%s: want an error, got %v", name, err)
		}
	}
}
