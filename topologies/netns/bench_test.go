package netns_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dpconform/dpconform/internal/privileged"
	"github.com/dpconform/dpconform/topologies"
	"github.com/dpconform/dpconform/topologies/netns"
)

// BenchmarkBringUp measures bringing up 2 nodes with 4 pods, control plane included,
// and taking them down again (target: up in under 10 s on a 2-core machine).
func BenchmarkBringUp(b *testing.B) {
	privileged.Require(b)
	var up, down time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		topo, err := netns.New(context.Background(), netns.Options{})
		if err != nil {
			b.Fatal(err)
		}
		for p := 0; p < 4; p++ {
			if _, err := topo.AddPod(context.Background(), topologies.PodSpec{Name: fmt.Sprintf("pod-%d", p), Node: topo.Nodes()[p%2].Name()}); err != nil {
				topo.Close()
				b.Fatal(err)
			}
		}
		up += time.Since(start)
		start = time.Now()
		if err := topo.Close(); err != nil {
			b.Fatal(err)
		}
		down += time.Since(start)
	}
	b.ReportMetric(up.Seconds()/float64(b.N), "s-up")
	b.ReportMetric(down.Seconds()/float64(b.N), "s-down")
	b.ReportMetric(0, "ns/op")
}
