package peers

import (
	"path/filepath"
	"testing"

	"github.com/dpconform/dpconform/internal/ledger"
)

// TestPeerTierResultsCurrent holds each run of the peers tier to the code: its newest
// entry in the ledger must exist, and nothing it was judged by may have changed since
// the commit it ran at. It needs git and the repository's history, neither root nor a
// binary, so make check runs it too.
func TestPeerTierResultsCurrent(t *testing.T) {
	runs, err := ledger.Load(filepath.Join(repoRoot, ledgerRoot))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range tierRuns {
		t.Run(p.Peer+"/"+p.Run, func(t *testing.T) {
			var newest *ledger.Run
			for i, r := range runs {
				if r.Implementation == p.Peer && r.Name == p.Run && (newest == nil || r.Provenance.Date.After(newest.Provenance.Date)) {
					newest = &runs[i]
				}
			}
			if newest == nil {
				t.Fatalf("no %s run of %s in %s: run `make test-peers PEERS=%s` and commit the entry it writes", p.Run, p.Peer, ledgerRoot, p.Peer)
			}
			why, err := ledger.Stale(repoRoot, *newest, p.judgedBy())
			if err != nil {
				t.Fatal(err)
			}
			if why != "" {
				t.Error(why)
			}
		})
	}
}
