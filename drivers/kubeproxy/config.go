package kubeproxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Mode is kube-proxy's proxy mode.
type Mode string

// The proxy modes the fixture runs. (ipvs is deprecated upstream and not offered.)
const (
	IPTables Mode = "iptables"
	NFTables Mode = "nftables"
)

// Modes are the modes the fixture runs, the default first.
var Modes = []Mode{IPTables, NFTables}

// ParseMode returns the Mode named s; "" is IPTables.
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "":
		return IPTables, nil
	case IPTables, NFTables:
		return Mode(s), nil
	}
	return "", fmt.Errorf("unknown kube-proxy mode %q; the fixture runs %s or %s", s, IPTables, NFTables)
}

// Defaults of a Config.
const (
	// DefaultClusterCIDR is the pod range of a netns topology (each node has a /24 of it).
	DefaultClusterCIDR = "10.244.0.0/16"
	// DefaultHealthzAddress and DefaultMetricsAddress are kube-proxy's usual ports, bound
	// to the loopback of the node's own network namespace: nothing outside the node
	// reaches them and two nodes never collide.
	DefaultHealthzAddress = "127.0.0.1:10256"
	DefaultMetricsAddress = "127.0.0.1:10249"
	// DefaultVerbosity logs every sync ("SyncProxyRules complete" with its duration).
	DefaultVerbosity = 2
)

// Config is what the fixture sets in kube-proxy's KubeProxyConfiguration. Everything
// else keeps kube-proxy's own defaults, except what would change the host outside the
// node's network namespace (see Render).
type Config struct {
	// NodeName is the Node object's name (hostnameOverride): kube-proxy reads its
	// InternalIP and pod CIDR from it. Required.
	NodeName string
	// Kubeconfig is the path of a kubeconfig reachable from inside the node. Required.
	Kubeconfig string
	// Mode is the proxy mode; "" means IPTables.
	Mode Mode
	// ClusterCIDR is the pod range, for kube-proxy's detection of local traffic;
	// "" means DefaultClusterCIDR.
	ClusterCIDR string
	// HealthzAddress and MetricsAddress are where kube-proxy serves /healthz and
	// /metrics inside the node; "" means the defaults.
	HealthzAddress, MetricsAddress string
	// Verbosity is klog's level; 0 means DefaultVerbosity.
	Verbosity int
}

// withDefaults returns c with its empty fields set to their defaults, or an error for a
// field that cannot work.
func (c Config) withDefaults() (Config, error) {
	var errs []error
	if c.NodeName == "" {
		errs = append(errs, errors.New("no NodeName: the name of the Node object kube-proxy runs for is required"))
	}
	if c.Kubeconfig == "" {
		errs = append(errs, errors.New("no Kubeconfig: a kubeconfig for the API server is required"))
	}
	mode, err := ParseMode(string(c.Mode))
	if err != nil {
		errs = append(errs, err)
	}
	c.Mode = mode
	if c.ClusterCIDR == "" {
		c.ClusterCIDR = DefaultClusterCIDR
	}
	for _, cidr := range strings.Split(c.ClusterCIDR, ",") {
		if _, err := netip.ParsePrefix(cidr); err != nil {
			errs = append(errs, fmt.Errorf("ClusterCIDR %q: %w", c.ClusterCIDR, err))
		}
	}
	if c.HealthzAddress == "" {
		c.HealthzAddress = DefaultHealthzAddress
	}
	if c.MetricsAddress == "" {
		c.MetricsAddress = DefaultMetricsAddress
	}
	for name, a := range map[string]string{"HealthzAddress": c.HealthzAddress, "MetricsAddress": c.MetricsAddress} {
		if _, err := netip.ParseAddrPort(a); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: want IP:port: %w", name, a, err))
		}
	}
	if c.Verbosity == 0 {
		c.Verbosity = DefaultVerbosity
	}
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("kube-proxy configuration: %w", err)
	}
	return c, nil
}

// The v1alpha1 KubeProxyConfiguration fields the fixture sets. Pointers and explicit
// zeros matter: kube-proxy defaults a missing conntrack field to a value it then
// writes into the kernel.
type fileConfig struct {
	APIVersion          string           `json:"apiVersion"`
	Kind                string           `json:"kind"`
	ClientConnection    clientConnection `json:"clientConnection"`
	Logging             logging          `json:"logging"`
	HostnameOverride    string           `json:"hostnameOverride"`
	HealthzBindAddress  string           `json:"healthzBindAddress"`
	MetricsBindAddress  string           `json:"metricsBindAddress"`
	BindAddressHardFail bool             `json:"bindAddressHardFail"`
	Mode                Mode             `json:"mode"`
	DetectLocalMode     string           `json:"detectLocalMode"`
	ClusterCIDR         string           `json:"clusterCIDR"`
	OOMScoreAdj         int32            `json:"oomScoreAdj"`
	Conntrack           conntrack        `json:"conntrack"`
}

type clientConnection struct {
	Kubeconfig string `json:"kubeconfig"`
}

type logging struct {
	Verbosity int `json:"verbosity"`
}

type conntrack struct {
	MaxPerCore            int32  `json:"maxPerCore"`
	Min                   int32  `json:"min"`
	TCPEstablishedTimeout string `json:"tcpEstablishedTimeout"`
	TCPCloseWaitTimeout   string `json:"tcpCloseWaitTimeout"`
}

// Render returns the KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1,
// as JSON, which kube-proxy reads as YAML) for c.
//
// It leaves the host alone outside the node's network namespace:
//   - conntrack maxPerCore 0 and min 0: kube-proxy leaves nf_conntrack_max (global to
//     the host, not per namespace) and the conntrack module's hashsize as they are;
//   - conntrack tcpEstablishedTimeout and tcpCloseWaitTimeout 0s: kube-proxy leaves the
//     conntrack TCP timeouts as they are (its defaults would set 24h and 1h);
//   - oomScoreAdj 0: kube-proxy stays an ordinary process for the host's OOM killer
//     (its default, -999, would make it nearly unkillable on a test machine).
//
// tcpBeLiberal and the UDP timeouts are left unset, which kube-proxy takes as "leave
// as is". bindAddressHardFail makes kube-proxy exit when it cannot serve /healthz or
// /metrics, rather than run without the signals readiness is read from.
func (c Config) Render() ([]byte, error) {
	c, err := c.withDefaults()
	if err != nil {
		return nil, err
	}
	fc := fileConfig{
		APIVersion:          "kubeproxy.config.k8s.io/v1alpha1",
		Kind:                "KubeProxyConfiguration",
		ClientConnection:    clientConnection{Kubeconfig: c.Kubeconfig},
		Logging:             logging{Verbosity: c.Verbosity},
		HostnameOverride:    c.NodeName,
		HealthzBindAddress:  c.HealthzAddress,
		MetricsBindAddress:  c.MetricsAddress,
		BindAddressHardFail: true,
		Mode:                c.Mode,
		DetectLocalMode:     "ClusterCIDR",
		ClusterCIDR:         c.ClusterCIDR,
		OOMScoreAdj:         0,
		Conntrack: conntrack{
			MaxPerCore:            0,
			Min:                   0,
			TCPEstablishedTimeout: "0s",
			TCPCloseWaitTimeout:   "0s",
		},
	}
	data, err := json.MarshalIndent(fc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("render kube-proxy configuration: %w", err)
	}
	return append(data, '\n'), nil
}

// modeOf reads the proxy mode back from a rendered configuration file.
func modeOf(data []byte) (Mode, error) {
	var fc struct {
		Mode Mode `json:"mode"`
	}
	if err := json.Unmarshal(data, &fc); err != nil {
		return "", fmt.Errorf("read kube-proxy configuration: %w", err)
	}
	return ParseMode(string(fc.Mode))
}
