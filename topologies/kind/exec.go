package kind

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"

	"github.com/dpconform/dpconform/driver/proc"
)

// enter rewrites cmd (not yet started) to run in h's mount, UTS, IPC and network
// namespaces, through nsenter, and starts it. nsenter enters them and executes the
// program, so the process the caller holds is the program itself: its stdin, stdout,
// signals and exit status are the caller's as with any child. The program is looked
// up in h's filesystem, by cmd.Path; a bare name that this host lacks (a node's tool)
// is looked up there on h's PATH.
func enter(h nsHost, cmd *exec.Cmd) error {
	pid, err := h.hostPID()
	if err != nil {
		return err
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return fmt.Errorf("nsenter (util-linux) is needed to run in %s: %w", h.Name(), err)
	}
	path := cmd.Path
	if cmd.Err != nil && len(cmd.Args) > 0 && !strings.Contains(cmd.Args[0], "/") {
		path, cmd.Err = cmd.Args[0], nil
	}
	if cmd.Err != nil {
		return cmd.Err
	}
	// --root and --wd: the target's root directory, which a container's pivot_root
	// made its own; entering the mount namespace alone leaves the namespace's.
	args := []string{"nsenter", "--target", strconv.Itoa(pid), "--mount", "--uts", "--ipc", "--net", "--root", "--wd", "--", path}
	if len(cmd.Args) > 1 {
		args = append(args, cmd.Args[1:]...)
	}
	cmd.Path, cmd.Args = nsenter, args
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s in %s: %w", path, h.Name(), err)
	}
	return nil
}

// containerPID finds, as the host sees it, the process of the container with the
// given ID whose command line starts with cmdline.
func containerPID(id string, cmdline []byte) (int, error) {
	if id == "" {
		return 0, fmt.Errorf("no container ID")
	}
	return proc.OfContainer(id, cmdline)
}
