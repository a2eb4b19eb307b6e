package netns

import (
	"strings"
	"testing"
	"time"
)

func TestSkewedClock(t *testing.T) {
	for host, want := range map[string]time.Duration{"node-a": time.Hour, "node-b": 2 * time.Hour, "external": -time.Hour} {
		if got, ok := SkewedClock(time.Hour, host); !ok || got != want {
			t.Errorf("%s: %v, %v; want %v", host, got, ok, want)
		}
	}
	if _, ok := SkewedClock(time.Hour, "pod-a"); ok {
		t.Error("a host the topology does not have has no clock of its own")
	}
}

func TestCheckClockSkew(t *testing.T) {
	for skew, want := range map[time.Duration]string{
		1500 * time.Millisecond:    "whole number of seconds",
		-time.Second:               "positive",
		100 * 365 * 24 * time.Hour: "choose a skew under",
		0:                          "",
	} {
		err := checkClockSkew(skew)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("skew %v: %v; want an error saying %q", skew, err, want)
		}
	}
}
