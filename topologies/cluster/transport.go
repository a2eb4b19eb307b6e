package cluster

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// runTransport is the suite's way into a cluster it shares with others. The specs
// name the namespace "default" (explicitly or by naming none) and create objects
// that know nothing of runs; on an existing cluster, the run must neither see nor
// touch what is there. So every request is rewritten on its way out:
//
//   - a path in namespace "default" goes to the run's namespace, and so does a body's
//     metadata.namespace "default";
//   - every object created (POST) carries the run's label, by which the run's end,
//     and `dpconform cleanup --kubeconfig` after a killed run, find what to remove.
//
// Bodies are JSON: restConfig asks for it. The API's replies name the run's
// namespace, which the specs then use as any other name.
type runTransport struct {
	next      http.RoundTripper
	namespace string // the run's
	label     string // RunLabel's value: the run ID
}

const defaultNSPath = "/namespaces/default"

func (t *runTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	p := req.URL.Path
	if i := strings.Index(p, defaultNSPath); i >= 0 && (len(p) == i+len(defaultNSPath) || p[i+len(defaultNSPath)] == '/') {
		// /api/v1/namespaces/default is the namespace itself: only objects in it move.
		if len(p) > i+len(defaultNSPath) {
			req = req.Clone(req.Context())
			req.URL.Path = p[:i] + "/namespaces/" + t.namespace + p[i+len(defaultNSPath):]
			req.URL.RawPath = ""
		}
	}
	if req.Body != nil && (req.Method == http.MethodPost || req.Method == http.MethodPut) &&
		strings.HasPrefix(req.Header.Get("Content-Type"), "application/json") {
		body, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		body = t.rewrite(body, req.Method == http.MethodPost)
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		req.ContentLength = int64(len(body))
		req.Header.Set("Content-Length", strconv.Itoa(len(body)))
	}
	return t.next.RoundTrip(req)
}

// rewrite moves an object's metadata.namespace "default" to the run's and, on create,
// labels it with the run. A body that is not an object (a subresource's options)
// passes unchanged.
func (t *runTransport) rewrite(body []byte, create bool) []byte {
	var obj map[string]any
	if json.Unmarshal(body, &obj) != nil {
		return body
	}
	meta, ok := obj["metadata"].(map[string]any)
	if !ok {
		return body
	}
	if meta["namespace"] == "default" {
		meta["namespace"] = t.namespace
	}
	if create {
		labels, _ := meta["labels"].(map[string]any)
		if labels == nil {
			labels = map[string]any{}
		}
		labels[RunLabel] = t.label
		meta["labels"] = labels
	}
	out, err := json.Marshal(obj)
	if err != nil {
		return body
	}
	return out
}
