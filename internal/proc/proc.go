// Package proc reads what the suite and the dataplanes need to know of processes
// from /proc.
package proc

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Alive reports whether pid runs. A zombie does not: an agent that exited after its
// parent (a driver) did is reparented to pid 1, which may never reap it.
func Alive(pid int) bool {
	state, err := field(pid, 0)
	return err == nil && state != "Z" && state != "X"
}

// StartTime is the process's start time in clock ticks since boot (/proc/PID/stat
// field 22), which tells a process apart from a later one with the same PID.
func StartTime(pid int) (uint64, error) {
	s, err := field(pid, 19)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(s, 10, 64)
}

// field returns field i of /proc/PID/stat counted from the state (field 3).
func field(pid, i int) (string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	// The command name (field 2) may hold spaces and parentheses; what follows its
	// last ')' is plain.
	j := bytes.LastIndexByte(data, ')')
	if j < 0 {
		return "", fmt.Errorf("unreadable /proc/%d/stat", pid)
	}
	f := strings.Fields(string(data[j+1:]))
	if len(f) <= i {
		return "", fmt.Errorf("unreadable /proc/%d/stat", pid)
	}
	return f[i], nil
}
