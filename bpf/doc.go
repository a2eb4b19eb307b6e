// Package bpf is the eBPF service datapath of the reference dataplane: tc
// programs for a node's host interface and for each workload's host-side
// interface, the maps they share, and the Go API that loads, attaches and
// programs them. It imports nothing of the project.
//
// How the programs handle a packet (hooks, NAT, conntrack and marks, the state they
// keep) is docs/reference-datapath.md.
package bpf
