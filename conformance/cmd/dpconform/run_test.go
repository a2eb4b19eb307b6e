package main

import (
	"strings"
	"testing"
)

func TestRunRefusesARepeatBelowOne(t *testing.T) {
	for _, n := range []string{"0", "-2"} {
		err := run([]string{"--driver", "/nonexistent/driver", "--repeat", n})
		if err == nil || !strings.Contains(err.Error(), "--repeat "+n) {
			t.Errorf("--repeat %s: %v, want an error naming --repeat", n, err)
		}
	}
}
