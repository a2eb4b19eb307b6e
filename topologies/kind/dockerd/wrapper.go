package dockerd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"syscall"
)

// wrapperFlag is the first argument dockerd's runtime configuration passes to the
// running executable, which RuntimeWrapperMain recognises.
const wrapperFlag = "--dpconform-runc-wrapper"

// capSysResource is the capability this host's bounding set lacks.
const capSysResource = "CAP_SYS_RESOURCE"

// RuntimeWrapperMain makes this executable dockerd's runtime when it was started as
// one: it drops CAP_SYS_RESOURCE from the OCI spec runc is about to apply (the bundle's
// config.json for create and run, the --process file for exec) and executes the real
// runc with the same arguments. A container asking for a capability the bounding set
// does not hold cannot start ("unable to apply caps: operation not permitted"), and
// docker grants every capability to --privileged containers, as kind's nodes are.
// Without the capability a container cannot raise its limits or lower an OOM score
// below its parent's, which no node of the project needs.
//
// main (or TestMain) of every program that starts a Daemon must call it first;
// otherwise it returns at once.
func RuntimeWrapperMain() {
	if len(os.Args) < 2 || os.Args[1] != wrapperFlag {
		return
	}
	args := os.Args[2:]
	if err := dropCapability(args); err != nil {
		fmt.Fprintf(os.Stderr, "dpconform runc wrapper: %v\n", err)
		os.Exit(1)
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		fmt.Fprintf(os.Stderr, "dpconform runc wrapper: %v\n", err)
		os.Exit(1)
	}
	err = syscall.Exec(runc, append([]string{"runc"}, args...), os.Environ())
	fmt.Fprintf(os.Stderr, "dpconform runc wrapper: exec %s: %v\n", runc, err)
	os.Exit(1)
}

// dropCapability edits the spec files runc's arguments name.
func dropCapability(args []string) error {
	for i := 0; i < len(args); i++ {
		var file string
		switch a := args[i]; {
		case (a == "--bundle" || a == "-b") && i+1 < len(args):
			file = args[i+1] + "/config.json"
		case len(a) > 9 && a[:9] == "--bundle=":
			file = a[9:] + "/config.json"
		case (a == "--process" || a == "-p") && i+1 < len(args):
			file = args[i+1]
		case len(a) > 10 && a[:10] == "--process=":
			file = a[10:]
		default:
			continue
		}
		if err := editSpec(file); err != nil {
			return err
		}
	}
	return nil
}

// editSpec removes capSysResource from every capability set of a runtime spec (its
// "process" object) or of a process spec (the file of `runc exec --process`).
func editSpec(file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var doc map[string]any
	// Numbers stay as written: limits such as 2^63-1 do not survive a float64.
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	p := doc
	if proc, ok := doc["process"].(map[string]any); ok {
		p = proc
	}
	caps, ok := p["capabilities"].(map[string]any)
	if !ok {
		return nil
	}
	changed := false
	for k, v := range caps {
		list, ok := v.([]any)
		if !ok {
			continue
		}
		kept := slices.DeleteFunc(slices.Clone(list), func(c any) bool { return c == capSysResource })
		if len(kept) != len(list) {
			caps[k] = kept
			changed = true
		}
	}
	if !changed {
		return nil
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	return os.WriteFile(file, out, 0o644)
}
