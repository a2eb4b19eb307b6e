package main

import (
	"os"
	"path/filepath"
	"testing"
)

// A stopped pause waits while a server of the pod's has a socket in its network
// namespace: a TCP listener or any UDP socket. Established and TIME_WAIT connections
// are not servers.
func TestServingSeesThePodsServers(t *testing.T) {
	const header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  bool
	}{
		{"no socket", map[string]string{"tcp": header, "tcp6": header, "udp": header, "udp6": header}, false},
		{"a TCP listener", map[string]string{"tcp": header + "   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0\n"}, true},
		{"a TCP listener on IPv6", map[string]string{"tcp6": header + "   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n"}, true},
		{"only established and TIME_WAIT connections", map[string]string{"tcp": header +
			"   0: 0100000A:1F90 0200000A:D431 01 00000000:00000000 00:00000000 00000000     0        0 1 1\n" +
			"   1: 0100000A:1F90 0200000A:D432 06 00000000:00000000 03:00000000 00000000     0        0 0 1\n"}, false},
		{"a UDP socket", map[string]string{"udp": header + "  10: 00000000:1F90 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1 2\n"}, true},
		{"no tables at all", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, data := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if got := serving(dir); got != tc.want {
				t.Errorf("serving = %v, want %v", got, tc.want)
			}
		})
	}
}
