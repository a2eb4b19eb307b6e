package kubeproxy

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dpconform/dpconform/driver/innetns"
)

// Status is what kube-proxy says about itself.
//
// kube-proxy's /healthz (and /livez) answer 200 from the moment its sync loop starts,
// before it has written a single rule: a fresh proxier counts as healthy "while it is
// starting up". So readiness also asks /metrics for the proof of a first sync:
// kubeproxy_sync_proxy_rules_last_timestamp_seconds, which kube-proxy sets only after a
// successful iptables-restore or nft transaction, per IP family. The metrics live in
// the process, so a restarted kube-proxy is not ready until it has synced itself;
// rules that the previous process left (the chains or the nftables table exist) prove
// nothing about the new one.
type Status struct {
	// PID is kube-proxy's PID, 0 when it does not run.
	PID int
	// Healthz is true when /healthz answered 200.
	Healthz bool
	// Synced are the IP families whose rules this process has written at least once.
	Synced []string
	// Pending are the IP families whose sync loop runs but has not written rules yet.
	Pending []string
	// Detail says why kube-proxy is not ready, for a person.
	Detail string
}

// Running reports whether kube-proxy runs.
func (s Status) Running() bool { return s.PID != 0 }

// Ready reports whether kube-proxy runs, is healthy and has synced every IP family it
// proxies at least once.
func (s Status) Ready() bool {
	return s.PID != 0 && s.Healthz && len(s.Synced) > 0 && len(s.Pending) == 0
}

// Metric names behind Status.
const (
	metricLastSync   = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
	metricLastQueued = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds"
)

// Status asks kube-proxy, inside the node, whether it is ready. It does not fail:
// what it could not learn is in Detail.
func (f *Fixture) Status(ctx context.Context) Status {
	st := Status{PID: f.PID()}
	if st.PID == 0 {
		st.Detail = "kube-proxy does not run"
		return st
	}
	cfg, err := f.Config.withDefaults()
	if err != nil {
		st.Detail = err.Error()
		return st
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	code, body, err := innetns.HTTPGet(ctx, f.NetNS, cfg.HealthzAddress, "/healthz")
	switch {
	case err != nil:
		st.Detail = "healthz: " + err.Error()
		return st
	case code != http.StatusOK:
		st.Detail = fmt.Sprintf("healthz answered %d: %s", code, strings.TrimSpace(string(body)))
		return st
	}
	st.Healthz = true
	code, body, err = innetns.HTTPGet(ctx, f.NetNS, cfg.MetricsAddress, "/metrics")
	switch {
	case err != nil:
		st.Detail = "metrics: " + err.Error()
		return st
	case code != http.StatusOK:
		st.Detail = fmt.Sprintf("metrics answered %d", code)
		return st
	}
	synced, queued := syncMetrics(body)
	for _, fam := range sortedKeys(queued) {
		if synced[fam] > 0 {
			st.Synced = append(st.Synced, fam)
		} else {
			st.Pending = append(st.Pending, fam)
		}
	}
	switch {
	case len(queued) == 0:
		st.Detail = "no proxier has started its sync loop yet (waiting for its Node object and informers)"
	case len(st.Pending) > 0:
		st.Detail = "no rules written yet for " + strings.Join(st.Pending, ", ")
	}
	return st
}

// syncMetrics returns, per IP family, the time of the last successful sync and of the
// last queued one (every started proxier has the latter).
func syncMetrics(text []byte) (synced, queued map[string]float64) {
	synced, queued = map[string]float64{}, map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(string(text)))
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var into map[string]float64
		switch {
		case strings.HasPrefix(line, metricLastSync+"{"):
			into = synced
		case strings.HasPrefix(line, metricLastQueued+"{"):
			into = queued
		default:
			continue
		}
		labels, value, ok := strings.Cut(line[strings.IndexByte(line, '{')+1:], "} ")
		if !ok {
			continue
		}
		fam := labelValue(labels, "ip_family")
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if fam == "" || err != nil {
			continue
		}
		into[fam] = v
	}
	return synced, queued
}

func labelValue(labels, name string) string {
	for _, l := range strings.Split(labels, ",") {
		k, v, ok := strings.Cut(l, "=")
		if ok && strings.TrimSpace(k) == name {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

func sortedKeys(m map[string]float64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
