package bpf_test

import (
	"log"
	"net/netip"

	"github.com/dpconform/dpconform/bpf"
)

// An agent's round: adopt what the previous run pinned, program a NodePort
// service, attach (or update in place) the programs, migrate conntrack if
// its size changed, and release the file descriptors: the datapath keeps
// running.
func Example() {
	d, err := bpf.Open("/run/dpc/node-a/bpf", bpf.Options{ConntrackSize: 1 << 16})
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()

	hostIP := netip.MustParseAddr("10.200.0.1")
	if err := d.SetConfig(hostIP, 2); err != nil {
		log.Fatal(err)
	}
	// Backends first, then the frontend that points at them.
	if err := d.Backends().Put(bpf.BackendKey{ServiceID: 1, Index: 0},
		bpf.BackendValue{Addr: netip.MustParseAddr("10.244.1.10"), Port: 8080}); err != nil {
		log.Fatal(err)
	}
	if err := d.Frontends().Put(bpf.FrontendKey{Addr: hostIP, Port: 30080, Proto: bpf.TCP},
		bpf.FrontendValue{ServiceID: 1, BackendCount: 1}); err != nil {
		log.Fatal(err)
	}

	if err := d.AttachHostByName("eth0"); err != nil {
		log.Fatal(err)
	}
	if err := d.AttachEndpointByName("veth1234", netip.MustParseAddr("10.244.0.5"), bpf.EndpointAntiSpoof); err != nil {
		log.Fatal(err)
	}
	// Only after the programs are attached: they no longer write the old map.
	if _, err := d.MigrateConntrack(); err != nil {
		log.Fatal(err)
	}
}
