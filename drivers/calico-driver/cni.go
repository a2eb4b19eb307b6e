package main

import "encoding/json"

// cniTemplate is Calico's pod network, as Calico's manifests (calico-bpf.yaml)
// configure it, but for the IPAM: host-local on the node's podCIDR instead of
// calico-ipam, so that pod addresses are the topology's (routed host-gw between nodes,
// as Felix's RouteSource=WorkloadIPs expects). The topology expands the variables per
// node (docs/driver.md, The CNI configuration); the plugin finds the API server by the
// node's kubeconfig and writes its log into the node's state directory, not the host's
// /var/log/calico.
//
// nodename_file_optional: calico-node writes /var/lib/calico/nodename at start-up; the
// plugin reads it only to learn the node's name, which it is given here.
const cniTemplate = `{
  "cniVersion": "0.3.1",
  "name": "k8s-pod-network",
  "plugins": [
    {
      "type": "calico",
      "log_level": "info",
      "log_file_path": "${STATE_DIR}/calico/cni.log",
      "datastore_type": "kubernetes",
      "nodename": "${NODE_NAME}",
      "nodename_file_optional": true,
      "mtu": 1500,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "${POD_CIDR}"}]],
        "dataDir": "${CNI_DATA_DIR}/ipam"
      },
      "policy": {"type": "k8s"},
      "kubernetes": {"kubeconfig": "${KUBECONFIG}"}
    }
  ]
}`

// cniConfig is cniTemplate as the raw JSON of info.cni.
func cniConfig() json.RawMessage { return json.RawMessage(cniTemplate) }
