package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// StatusFile is the name, in the state directory, of the file where the agent says
// whether it is ready. The driver reads it for `status`.
const StatusFile = "refdp.status.json"

// Status is the content of StatusFile.
type Status struct {
	PID     int       `json:"pid"`
	Ready   bool      `json:"ready"`
	Message string    `json:"message"`
	Updated time.Time `json:"updated"`
	// ReadySinceNS is when this process last became ready (wrote itself ready after
	// not being so), CLOCK_MONOTONIC nanoseconds; 0 while it is not ready.
	ReadySinceNS int64 `json:"readySinceNs,omitempty"`
	// Conntrack is the conntrack map the agent's programs use and its format (the
	// version of refdp), e.g. "dpc_conntrack_v2 (v2)".
	Conntrack string `json:"conntrack,omitempty"`
	// Migration is what the agent's start copied from the conntrack maps of a
	// previous run (another size or version); nil if there were none.
	Migration *Migration `json:"migration,omitempty"`
}

// Migration is a conntrack migration at start (bpf.Migration).
type Migration struct {
	// From names the previous maps, e.g. "dpc_conntrack (v1, 65536 entries)".
	From []string `json:"from"`
	// Copied entries, and Present: those the new map had already (adopted by the
	// programs since they were loaded, or a new flow's).
	Copied  int `json:"copied"`
	Present int `json:"present"`
	// DurationMs is how long the copy took.
	DurationMs float64 `json:"durationMs"`
}

type statusFile struct {
	path       string
	conntrack  string
	migration  *Migration
	readySince int64
}

// write replaces the status file atomically, so a reader never sees half of it.
func (s *statusFile) write(ready bool, msg string) error {
	switch {
	case !ready:
		s.readySince = 0
	case s.readySince == 0:
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err == nil {
			s.readySince = ts.Nano()
		}
	}
	data, err := json.Marshal(Status{PID: os.Getpid(), Ready: ready, Message: msg, Updated: time.Now(),
		ReadySinceNS: s.readySince, Conntrack: s.conntrack, Migration: s.migration})
	if err != nil {
		return err
	}
	tmp := s.path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("write status: %w", err)
	}
	return os.Rename(tmp, s.path)
}

// ReadStatus reads the status file in stateDir.
func ReadStatus(stateDir string) (Status, error) {
	var st Status
	data, err := os.ReadFile(filepath.Join(stateDir, StatusFile))
	if err != nil {
		return st, err
	}
	err = json.Unmarshal(data, &st)
	return st, err
}

func writeSysctl(key, value string) error {
	if err := os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", key, value, err)
	}
	return nil
}
