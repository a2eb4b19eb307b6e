// Command mydp-driver is the Go driver of docs/driver.md ("Writing a driver in Go"),
// compiled so that the page's listing cannot rot: docs' test holds the listing to
// main below. Its verbs do nothing a real dataplane would; a vendor fills them in.
package main

import (
	"context"
	"errors"

	"github.com/dpconform/dpconform/driver"
	"github.com/dpconform/dpconform/driver/skel"
)

func main() {
	skel.Main("mydp-driver", skel.Funcs{
		Info: func(context.Context) (driver.Info, error) {
			return driver.Info{Name: "mydp", Version: "1.2.0", Profiles: []string{"Core"},
				Features: []string{"ClusterIP", "NodePort", "TCP"}, Modes: []string{"tc", "xdp"}}, nil
		},
		Start:   start,  // func(context.Context, skel.Node, driver.StartOptions) (pid int, err error)
		Status:  status, // func(context.Context, skel.Node) (driver.Status, error)
		Stop:    stop,   // func(context.Context, skel.Node) error
		Kill:    kill,
		Collect: collect, // func(context.Context, skel.Node, dir string) ([]string, error)
		Cleanup: cleanup,
		// A nil verb (here Events) answers {"error":"unsupported"}.
	})
}

var errNotImplemented = errors.New("mydp: not implemented in this example")

func start(context.Context, skel.Node, driver.StartOptions) (int, error) {
	return 0, errNotImplemented
}

func status(context.Context, skel.Node) (driver.Status, error) {
	return driver.Status{}, errNotImplemented
}

func stop(context.Context, skel.Node) error    { return errNotImplemented }
func kill(context.Context, skel.Node) error    { return errNotImplemented }
func cleanup(context.Context, skel.Node) error { return errNotImplemented }

func collect(context.Context, skel.Node, string) ([]string, error) {
	return nil, errNotImplemented
}
