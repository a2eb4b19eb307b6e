// Package kind provides a topology of kind clusters, made with sigs.k8s.io/kind's Go
// API on the project's own dockerd (topologies/kind/dockerd), serving the same
// topologies.Topology interface as the netns topology.
package kind
