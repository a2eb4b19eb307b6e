package bpf

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// BenchmarkMigrateConntrack measures MigrateConntrack's copy of 1,000,000
// entries from a refdp v1 map into a v2 map (an upgrade), in this process:
// the copy alone. The agent's own figures, with traffic through the node
// (time to ready, peak RSS), are reference/e2e's BenchmarkConntrackUpgrade.
func BenchmarkMigrateConntrack(b *testing.B) {
	requireBPF(b)
	const entries = 1_000_000
	const size = 1 << 21
	var total time.Duration
	for i := 0; i < b.N; i++ {
		dir := bpffs(b)
		old, err := Open(dir, Options{ConntrackFormat: ConntrackFormatV1, ConntrackSize: size})
		must(b, err)
		fillConntrack(b, old.Conntrack().Raw(), ConntrackFormatV1, entries)
		must(b, old.Close())
		d, err := Open(dir, Options{ConntrackFormat: ConntrackFormatV2, ConntrackSize: size})
		must(b, err)
		mig, err := d.MigrateConntrack()
		must(b, err)
		if mig.Copied != entries {
			b.Fatalf("copied %d of %d entries", mig.Copied, entries)
		}
		total += mig.Duration
		must(b, d.Close())
		must(b, Remove(dir))
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/1M-entries")
	b.ReportMetric(0, "ns/op")
}

// fillConntrack writes n distinct entries (flows of 10.0.0.0/8 clients to one
// service) into m, in batches.
func fillConntrack(b testing.TB, m *ebpf.Map, f ConntrackFormat, n int) {
	const chunk = 8192
	v, err := (ConntrackValue{Flags: ConntrackDNAT, ServiceID: 1, NATAddr: ip("10.244.1.10"), NATPort: 8080}).marshal(f)
	must(b, err)
	keys := make([][conntrackKeySize]byte, chunk)
	vals, raw := byteRows(chunk, f.ValueSize())
	for i := 0; i < chunk; i++ {
		copy(raw[i*len(v):], v)
	}
	for done := 0; done < n; {
		c := min(chunk, n-done)
		for i := 0; i < c; i++ {
			k := &keys[i]
			id := uint32(done + i)
			k[0], k[1], k[2], k[3] = 10, byte(id>>16), byte(id>>8), byte(id)
			k[4], k[5], k[6], k[7] = 10, 96, 0, 10
			binary.BigEndian.PutUint16(k[8:], 40000)
			binary.BigEndian.PutUint16(k[10:], 80)
			k[12] = byte(TCP)
		}
		if _, err := m.BatchUpdate(keys[:c], vals.Slice(0, c).Interface(), nil); err != nil {
			b.Fatalf("fill conntrack: %v", err)
		}
		done += c
	}
}
