package suite

import (
	"regexp"
	"testing"
)

// A focus is over spec IDs: anchors mean the ends of the ID, and the Ginkgo focus
// built from it selects those specs and no other.
func TestFocusOnIDs(t *testing.T) {
	const (
		a = "FOCUS-TEST-ALPHA"
		b = "FOCUS-TEST-ALPHA-BETA"
	)
	for _, tc := range []struct {
		focus     []string
		want, not []string
	}{
		{[]string{"^" + a + "$"}, []string{a}, []string{b}},
		{[]string{"FOCUS-TEST-ALPHA"}, []string{a, b}, nil},
		{[]string{"BETA$", "^NOTHING$"}, []string{b}, []string{a}},
		{[]string{"^NOTHING$"}, nil, []string{a, b}},
	} {
		f, err := focusOn(tc.focus, []string{a, b})
		if err != nil {
			t.Fatalf("%q: %v", tc.focus, err)
		}
		re := regexp.MustCompile(f)
		for _, id := range tc.want {
			if !re.MatchString("dpconform " + id) {
				t.Errorf("focus %q (Ginkgo %q) does not select %s", tc.focus, f, id)
			}
		}
		for _, id := range tc.not {
			if re.MatchString("dpconform " + id) {
				t.Errorf("focus %q (Ginkgo %q) selects %s", tc.focus, f, id)
			}
		}
	}
	if _, err := focusOn([]string{"RESTART-("}, []string{a}); err == nil {
		t.Error("an invalid regular expression was accepted")
	}
}
