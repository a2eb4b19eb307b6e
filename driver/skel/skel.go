// Package skel makes a driver executable's main one call, the way CNI's skel does for
// plugins: it parses the verb and its flags, reads and checks the node environment of
// the driver contract (docs/driver.md), refuses start options the implementation does
// not offer, calls the verb's function and writes the reply in the contract's shape.
// A driver written with it gets every rule of the contract that does not depend on
// the implementation right, and its tests need only cover what does.
//
//	func main() {
//		skel.Main("mydp-driver", skel.Funcs{
//			Info:   info,
//			Start:  start,
//			Status: status,
//			...
//		})
//	}
package skel

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/dpconform/dpconform/driver"
)

// Node is the environment of one node verb, as the suite sets it (docs/driver.md,
// Environment), checked before the verb's function is called.
type Node struct {
	Name       string // DPC_NODE: the node's name (its Node object)
	NetNS      string // DPC_NETNS: the node's network namespace; empty on kind
	Kubeconfig string // DPC_KUBECONFIG: a kubeconfig for the API server
	StateDir   string // DPC_STATE_DIR: a directory private to this node and run
	BPFFS      string // DPC_BPFFS: a bpffs private to this node; empty if the topology has none
	Topology   string // DPC_TOPOLOGY: "netns" or "kind"
	Run        string // DPC_RUN: the run's ID, for the agent's environment
}

// Funcs are an implementation's verbs. A nil function answers that the driver does
// not implement its verb ("unsupported"), which the suite reports against the
// profiles that need it.
type Funcs struct {
	// Info returns the static facts of `info`. `start` calls it too, to refuse options
	// it does not offer, so it should be cheap and need no node.
	Info    func(ctx context.Context) (driver.Info, error)
	Start   func(ctx context.Context, n Node, opts driver.StartOptions) (pid int, err error)
	Status  func(ctx context.Context, n Node) (driver.Status, error)
	Stop    func(ctx context.Context, n Node) error
	Kill    func(ctx context.Context, n Node) error
	Events  func(ctx context.Context, n Node, cursor string) (driver.Events, error)
	Collect func(ctx context.Context, n Node, dir string) (files []string, err error)
	Cleanup func(ctx context.Context, n Node) error

	// RequireNetNS makes DPC_NETNS required, for a driver that runs its agent only in
	// a netns topology.
	RequireNetNS bool
	// CheckNode, when set, vets the node environment for what the driver needs
	// beyond the contract. It runs before the contract's own checks, on values that
	// may be empty, so that it can refuse a topology the driver does not support
	// with its own reason rather than a missing variable that topology never sets.
	CheckNode func(n Node) error
}

// Failure is an error with the contract's {"error","detail"} shape: Msg says what
// failed in a few words, Detail what to do about it. Any other error a function
// returns is replied as {"error":"failed","detail":err}.
type Failure struct {
	Msg, Detail string
	err         error
}

// Fail returns a Failure with a short message and a detail that names the fix; format
// and args are as for fmt.Errorf, so %w keeps the cause for errors.Is and errors.As.
func Fail(msg, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return &Failure{Msg: msg, Detail: err.Error(), err: err}
}

func (f *Failure) Error() string { return f.Msg + ": " + f.Detail }

// Unwrap returns the detail as an error, through which errors.Is and errors.As reach
// what Fail's format wrapped with %w.
func (f *Failure) Unwrap() error { return f.err }

// Main runs the driver for the verb in os.Args with the process's environment, writes
// its reply to stdout and exits: 0 on success, 1 on failure. name is the executable's
// name, for usage and stderr.
func Main(name string, funcs Funcs) {
	os.Exit(Run(context.Background(), name, funcs, os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr))
}

// Verbs are the contract's verbs, in the order of docs/driver.md.
var Verbs = []string{"info", "start", "status", "stop", "kill", "events", "collect", "cleanup"}

// Run is Main without the process: it runs the verb in args (os.Args[1:]) with the
// environment lookupEnv gives, writes the reply to stdout and the error, if any, to
// stderr, and returns the exit code.
func Run(ctx context.Context, name string, funcs Funcs, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	out, err := dispatch(ctx, name, funcs, args, lookupEnv)
	var reply []byte
	if err == nil {
		if reply, err = json.Marshal(out); err != nil {
			err = Fail("bad reply", "%s cannot encode its reply: %w", name, err)
		}
	}
	if err != nil {
		var f *Failure
		if !errors.As(err, &f) {
			f = &Failure{Msg: "failed", Detail: err.Error()}
		}
		reply, _ = json.Marshal(struct {
			Error  string `json:"error"`
			Detail string `json:"detail"`
		}{f.Msg, f.Detail})
		fmt.Fprintf(stdout, "%s\n", reply)
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s\n", reply)
	return 0
}

// empty is the reply of a verb that returns nothing: {}.
type empty struct{}

func dispatch(ctx context.Context, name string, funcs Funcs, args []string, lookupEnv func(string) (string, bool)) (any, error) {
	if len(args) == 0 {
		return nil, Fail("usage", "%s VERB [flags]; verbs: %s", name, strings.Join(Verbs, " "))
	}
	verb, args := args[0], args[1:]
	if !funcs.has(verb) {
		if !isVerb(verb) {
			return nil, Fail("unknown verb", "%q; verbs: %s", verb, strings.Join(Verbs, " "))
		}
		return nil, unsupported(name, verb)
	}
	fl, err := parseFlags(verb, args)
	if err != nil {
		return nil, err
	}
	if verb == "info" {
		info, err := funcs.Info(ctx)
		if err == nil && info.Name == "" {
			err = Fail("bad info", "%s: info has no name; the suite needs one for the report", name)
		}
		// The contract's lists are arrays, never null.
		for _, l := range []*[]string{&info.Profiles, &info.Features} {
			if *l == nil {
				*l = []string{}
			}
		}
		return info, err
	}
	if verb == "start" {
		// Refused before the node is even looked at: the options are wrong whatever
		// the node, and the implementation must not be asked to start what it does not
		// say it can.
		info := driver.Info{Name: name}
		if funcs.Info != nil {
			if info, err = funcs.Info(ctx); err != nil {
				return nil, fmt.Errorf("info, for the options start offers: %w", err)
			}
		}
		if err := info.Offers(fl.start); err != nil {
			return nil, Fail("not offered", "%s", strings.ReplaceAll(err.Error(), "\n", "; "))
		}
	}
	n, err := nodeEnv(name, funcs, lookupEnv)
	if err != nil {
		return nil, err
	}
	switch verb {
	case "start":
		pid, err := funcs.Start(ctx, n, fl.start)
		return map[string]int{"pid": pid}, err
	case "status":
		return funcs.Status(ctx, n)
	case "stop":
		return empty{}, funcs.Stop(ctx, n)
	case "kill":
		return empty{}, funcs.Kill(ctx, n)
	case "events":
		ev, err := funcs.Events(ctx, n, fl.cursor)
		if ev.Events == nil {
			ev.Events = []driver.Event{}
		}
		return ev, err
	case "collect":
		// The suite creates the directory, but a driver must never lose its files
		// because it did not.
		if err := os.MkdirAll(fl.dir, 0o755); err != nil {
			return nil, Fail("collect failed", "creating --dir: %w", err)
		}
		files, err := funcs.Collect(ctx, n, fl.dir)
		if files == nil {
			files = []string{}
		}
		return map[string][]string{"files": files}, err
	case "cleanup":
		return empty{}, funcs.Cleanup(ctx, n)
	}
	return nil, fmt.Errorf("skel: verb %s has a function but no dispatch", verb)
}

func (f Funcs) has(verb string) bool {
	switch verb {
	case "info":
		return f.Info != nil
	case "start":
		return f.Start != nil
	case "status":
		return f.Status != nil
	case "stop":
		return f.Stop != nil
	case "kill":
		return f.Kill != nil
	case "events":
		return f.Events != nil
	case "collect":
		return f.Collect != nil
	case "cleanup":
		return f.Cleanup != nil
	}
	return false
}

func isVerb(verb string) bool {
	for _, v := range Verbs {
		if v == verb {
			return true
		}
	}
	return false
}

func unsupported(name, verb string) error {
	if verb == "events" {
		return Fail("unsupported", "%s does not implement events: it reports no policy verdicts, so it cannot claim the Observability profile", name)
	}
	return Fail("unsupported", "%s does not implement %s", name, verb)
}

// flags are the parsed flags of one verb.
type flags struct {
	start  driver.StartOptions
	cursor string
	dir    string
}

// usage is each verb's synopsis, for errors.
var usage = map[string]string{
	"start":   "start [--mode M] [--version V] [--set key=value]...",
	"events":  "events [--cursor C]",
	"collect": "collect --dir DIR",
}

func parseFlags(verb string, args []string) (flags, error) {
	var fl flags
	synopsis := usage[verb]
	if synopsis == "" {
		if len(args) > 0 {
			return fl, Fail("bad arguments", "unexpected arguments %q; usage: %s", args, verb)
		}
		return fl, nil
	}
	fs := flag.NewFlagSet(verb, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	switch verb {
	case "start":
		fs.StringVar(&fl.start.Mode, "mode", "", "")
		fs.StringVar(&fl.start.Version, "version", "", "")
		fs.Func("set", "", func(kv string) error {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return fmt.Errorf("%q is not key=value", kv)
			}
			if _, dup := fl.start.Set[k]; dup {
				return fmt.Errorf("%q set twice", k)
			}
			if fl.start.Set == nil {
				fl.start.Set = map[string]string{}
			}
			fl.start.Set[k] = v
			return nil
		})
	case "events":
		fs.StringVar(&fl.cursor, "cursor", "", "")
	case "collect":
		fs.StringVar(&fl.dir, "dir", "", "")
	}
	if err := fs.Parse(args); err != nil {
		return fl, Fail("bad arguments", "%v; usage: %s", err, synopsis)
	}
	if fs.NArg() > 0 {
		return fl, Fail("bad arguments", "unexpected arguments %q; usage: %s", fs.Args(), synopsis)
	}
	if verb == "collect" && fl.dir == "" {
		return fl, Fail("bad arguments", "collect needs --dir; usage: %s", synopsis)
	}
	return fl, nil
}

// nodeEnv reads the node's environment and checks what the contract promises of it.
func nodeEnv(name string, funcs Funcs, lookupEnv func(string) (string, bool)) (Node, error) {
	get := func(k string) string { v, _ := lookupEnv(k); return v }
	n := Node{
		Name:       get("DPC_NODE"),
		NetNS:      get("DPC_NETNS"),
		Kubeconfig: get("DPC_KUBECONFIG"),
		StateDir:   get("DPC_STATE_DIR"),
		BPFFS:      get("DPC_BPFFS"),
		Topology:   get("DPC_TOPOLOGY"),
		Run:        get("DPC_RUN"),
	}
	if funcs.CheckNode != nil {
		if err := funcs.CheckNode(n); err != nil {
			return n, err
		}
	}
	var missing []string
	for _, v := range []struct {
		key, val string
		need     bool
	}{
		{"DPC_NODE", n.Name, true},
		{"DPC_NETNS", n.NetNS, funcs.RequireNetNS},
		{"DPC_KUBECONFIG", n.Kubeconfig, true},
		{"DPC_STATE_DIR", n.StateDir, true},
	} {
		if v.need && v.val == "" {
			missing = append(missing, v.key)
		}
	}
	if len(missing) > 0 {
		hint := ""
		if funcs.RequireNetNS && n.NetNS == "" {
			hint = fmt.Sprintf("; %s needs a netns topology (DPC_NETNS)", name)
		}
		return n, Fail("bad environment", "%s not set; the suite sets them per node (see docs/driver.md)%s", strings.Join(missing, ", "), hint)
	}
	if st, err := os.Stat(n.StateDir); err != nil || !st.IsDir() {
		return n, Fail("bad environment", "DPC_STATE_DIR=%s is not a directory; the suite creates one per node and run", n.StateDir)
	}
	if n.NetNS != "" {
		if _, err := os.Stat(n.NetNS); err != nil {
			return n, Fail("bad environment", "DPC_NETNS=%s: %v (is the topology still up?)", n.NetNS, err)
		}
	}
	return n, nil
}
