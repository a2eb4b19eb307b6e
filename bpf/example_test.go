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

// A flow-log reader, in a process of its own: it drains what the programs
// reported since the last reader drained, and says how many verdicts found the
// ring buffer full since it was created (compare with the last reader's count
// to know whether any were lost since).
func ExampleOpenVerdicts() {
	r, err := bpf.OpenVerdicts("/run/dpc/node-a/bpf")
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	vs, err := r.Drain()
	if err != nil {
		log.Fatal(err)
	}
	for _, v := range vs {
		log.Printf("%d %s", v.TimeNs, v) // e.g. "deny ingress 10.0.0.2:5000->10.244.0.5:80/TCP on if7 (no rule matched)"
	}
	lost, err := r.Lost()
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("%d verdicts lost in all", lost)
}
