// Package driverreply writes a driver executable's answer in the shape the driver
// contract (docs/driver.md) asks for: one JSON object on stdout and exit 0, or
// {"error","detail"} on stdout, the error on stderr, and exit 1.
package driverreply

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
)

// Failure is an error with the contract's {"error","detail"} shape.
type Failure struct{ Msg, Detail string }

func (f *Failure) Error() string { return f.Msg + ": " + f.Detail }

// Fail returns a Failure with a short message and a detail that names the fix.
func Fail(msg, format string, args ...any) error {
	return &Failure{Msg: msg, Detail: fmt.Sprintf(format, args...)}
}

// Exit writes out (nil means {}) or err and exits; prog prefixes the stderr line.
func Exit(prog string, out any, err error) {
	enc := json.NewEncoder(os.Stdout)
	if err != nil {
		var f *Failure
		if !errors.As(err, &f) {
			f = &Failure{Msg: "failed", Detail: err.Error()}
		}
		_ = enc.Encode(map[string]string{"error": f.Msg, "detail": f.Detail})
		fmt.Fprintf(os.Stderr, "%s: %v\n", prog, err)
		os.Exit(1)
	}
	if out == nil {
		out = struct{}{}
	}
	_ = enc.Encode(out)
	os.Exit(0)
}
