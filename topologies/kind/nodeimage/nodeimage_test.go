package nodeimage

import (
	"os"
	"regexp"
	"testing"
)

// The kind version whose files and API the project uses must be the one go.mod pins.
func TestKindVersionMatchesGoMod(t *testing.T) {
	mod, err := os.ReadFile("../../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*sigs\.k8s\.io/kind\s+(\S+)`).FindSubmatch(mod)
	if m == nil || string(m[1]) != KindVersion {
		t.Errorf("go.mod requires sigs.k8s.io/kind %s, nodeimage.KindVersion is %s", m, KindVersion)
	}
}

func TestMirrorIn(t *testing.T) {
	for _, c := range []struct{ name, text, want string }{
		{"deb822", "Types: deb\nURIs: http://deb.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n", "http://deb.example/debian"},
		{"deb822, security only", "Types: deb\nURIs: http://sec.example/debian-security\nSuites: bookworm-security\nComponents: main\n", ""},
		{"deb822, second stanza", "Types: deb-src\nURIs: http://src.example\nSuites: bookworm\nComponents: main\n\nTypes: deb\nURIs: http://b.example/debian\nSuites: bookworm\nComponents: main contrib\n", "http://b.example/debian"},
		{"one-line", "# comment\ndeb http://old.example/debian bookworm main contrib\n", "http://old.example/debian"},
		{"one-line with options", "deb [arch=amd64 signed-by=/k.gpg] http://o.example/debian bookworm main\n", "http://o.example/debian"},
		{"one-line, another suite", "deb http://old.example/debian bullseye main\n", ""},
		{"one-line, no main", "deb http://old.example/debian bookworm contrib\n", ""},
	} {
		if got := mirrorIn(c.text); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
