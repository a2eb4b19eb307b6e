package main

// The agent's compile cache.
//
// Cilium's agent compiles its datapath (bpf_host.c, bpf_lxc.c) with clang every time
// it starts: its template cache starts empty in every process and its directory is
// removed, so a restart compiles again what the last process compiled, for the same
// node. Each compile takes seconds of a CPU (10-13 s on a loaded 2-core machine), and
// the compiles of a restart starve the suite's probes, which then report stalls that
// are the compiler's, not the dataplane's (docs/cilium.md, "The compile cache").
//
// So the agent's `clang` is this driver (the multi-call wrapper at
// $DPC_STATE_DIR/cilium-bin/clang), which serves a compile from a content-addressed
// cache when it has compiled the same input before, and otherwise runs the real clang
// and stores its output. The cache is the node's (in its state directory, gone with
// the run): another node's or another run's input differs anyway, since Cilium
// compiles the node's own netns cookie and router IP into its objects.
//
// The key is what determines the object: the real clang (its path, size and
// modification time, as ccache's default compiler check), the working directory,
// every argument, the environment variables clang reads, and the preprocessed source
// (every header included, every macro expanded, every path in its line markers). Identical input gives an identical object, so a hit hands the
// agent the bytes clang would have written: it changes how long a start takes, never
// what the agent loads. ccache does this, but refuses output to stdout (`-o -`),
// which is how Cilium compiles.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"
)

// EnvObjectCache is the compile cache's directory; "off" turns the cache off (the
// agent then runs the real clang directly). Default: objectsDir in the node's state
// directory. The driver passes the directory to the wrapper in the agent's
// environment.
const EnvObjectCache = "DPC_CILIUM_OBJECT_CACHE"

// Names in the node's state directory: the wrapper's directory, which goes first on
// the agent's PATH, and the cache's; and the name the agent runs.
const (
	wrapperDir = "cilium-bin"
	objectsDir = "cilium-objects"
	clangName  = "clang"
)

// cacheVersion changes when the key's composition does, so that old entries miss.
const cacheVersion = "dpconform cilium clang cache v1"

// Bounds of the cache, for a directory that DPC_CILIUM_OBJECT_CACHE shares: an entry
// unused for maxAge goes, and past maxBytes the least recently used go until the
// cache is at 3/4 of it. One agent start stores three objects, ~2.6 MB in all.
const (
	maxBytes = 256 << 20
	maxAge   = 14 * 24 * time.Hour
)

// clangEnv are the environment variables that change what clang compiles or how.
var clangEnv = []string{"CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH",
	"CCC_OVERRIDE_OPTIONS", "SOURCE_DATE_EPOCH", "COMPILER_PATH", "TMPDIR"}

// objectCacheDir is the compile cache's directory for a node's state directory, or
// "" when the cache is off.
func objectCacheDir(stateDir string) string {
	switch d := os.Getenv(EnvObjectCache); d {
	case "off":
		return ""
	case "":
		return filepath.Join(stateDir, objectsDir)
	default:
		return d
	}
}

// cacheable says whether a compile's output can be cached: a compile (-c) of one
// source file to stdout, which writes no other file. What else clang is asked to do
// (preprocess only, print its version, dependency files, response files whose
// content the key would not see) goes to the real clang untouched.
func cacheable(args []string) bool {
	n := len(args)
	if n < 3 || args[n-2] != "-o" || args[n-1] != "-" || !slices.Contains(args, "-c") {
		return false
	}
	for _, a := range args[:n-2] {
		switch {
		case a == "-" || a == "-E" || a == "-v" || a == "-###" || a == "-o",
			strings.HasPrefix(a, "@"),
			strings.HasPrefix(a, "-M"),
			strings.HasPrefix(a, "--version"),
			strings.HasPrefix(a, "-save-temps"),
			strings.HasPrefix(a, "-ftime-trace"),
			strings.HasPrefix(a, "-gsplit-dwarf"),
			strings.HasPrefix(a, "--serialize-diagnostics"):
			return false
		}
	}
	return true
}

// runClang is the driver run as the agent's clang. It exits as the real clang would
// have: same stdout, same stderr, same status.
func runClang(args []string) int {
	real := Clang()
	if self, err := os.Executable(); err == nil && sameFile(self, real) {
		fmt.Fprintf(os.Stderr, "cilium-driver: %s=%s is this wrapper, not a clang\n", EnvClang, real)
		return 2
	}
	dir := os.Getenv(EnvObjectCache)
	if dir == "" || dir == "off" || !cacheable(args) {
		err := syscall.Exec(real, append([]string{real}, args...), os.Environ())
		fmt.Fprintf(os.Stderr, "cilium-driver: exec %s: %v\n", real, err)
		return 127
	}
	// The real clang gets SIGKILL when this process dies (Pdeathsig), as the agent
	// kills a compile it cancels; Pdeathsig is the thread's, so keep to one.
	runtime.LockOSThread()
	c := &clangCache{Real: real, Dir: dir}
	code, err := c.compile(args, os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cilium-driver: clang cache: %v\n", err)
	}
	return code
}

// clangCache serves compiles of Real from Dir.
type clangCache struct {
	Real string
	Dir  string
}

// compile serves a cacheable compile: from the cache on a hit, else from the real
// clang, whose output it then stores. It returns clang's exit status, and an error
// for what went wrong around it (the compile's own failure is its status and its
// stderr).
func (c *clangCache) compile(args []string, stdout, stderr io.Writer) (int, error) {
	key, err := c.key(args)
	if err != nil {
		// No key (say, a source that does not preprocess): the real clang says why.
		return c.run(args, stdout, stderr)
	}
	obj := filepath.Join(c.Dir, key[:2], key)
	if code, ok := c.hit(obj, stdout, stderr); ok {
		return code, nil
	}
	if err := os.MkdirAll(filepath.Dir(obj), 0o755); err != nil {
		code, rerr := c.run(args, stdout, stderr)
		return code, errors.Join(err, rerr)
	}
	tmp, err := os.CreateTemp(filepath.Dir(obj), key+".tmp*")
	if err != nil {
		code, rerr := c.run(args, stdout, stderr)
		return code, errors.Join(err, rerr)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	var diag bytes.Buffer
	code, err := c.run(args, tmp, io.MultiWriter(stderr, &diag))
	if err != nil || code != 0 {
		// A failed compile is not stored; what it wrote goes on as clang wrote it.
		if _, serr := tmp.Seek(0, io.SeekStart); serr == nil {
			_, _ = io.Copy(stdout, tmp)
		}
		return code, err
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return 1, err
	}
	if _, err := io.Copy(stdout, tmp); err != nil {
		return 1, err
	}
	// The diagnostics first, the object last: an object in the cache has its
	// diagnostics beside it.
	if err := c.store(obj, tmp, diag.Bytes()); err != nil {
		return 0, err
	}
	c.prune(time.Now(), maxBytes)
	return 0, nil
}

// hit writes a cached object and its diagnostics, if the cache has them.
func (c *clangCache) hit(obj string, stdout, stderr io.Writer) (int, bool) {
	f, err := os.Open(obj)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	diag, err := os.ReadFile(obj + ".stderr")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, false
	}
	if _, err := io.Copy(stdout, f); err != nil {
		fmt.Fprintf(os.Stderr, "cilium-driver: clang cache: write %s: %v\n", obj, err)
		return 1, true
	}
	_, _ = stderr.Write(diag)
	now := time.Now()
	_ = os.Chtimes(obj, now, now) // the least recently used go first
	return 0, true
}

// store moves a compile's output into the cache under obj.
func (c *clangCache) store(obj string, tmp *os.File, diag []byte) error {
	if len(diag) > 0 {
		if err := os.WriteFile(obj+".stderr", diag, 0o644); err != nil {
			return err
		}
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), obj)
}

// run runs the real clang.
func (c *clangCache) run(args []string, stdout, stderr io.Writer) (int, error) {
	cmd := exec.Command(c.Real, args...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if code := exit.ExitCode(); code >= 0 {
			return code, nil
		}
		return 128 + int(syscall.SIGKILL), err
	}
	if err != nil {
		return 127, err
	}
	return 0, nil
}

// key is the cache key of a compile: a hash of everything its output depends on.
func (c *clangCache) key(args []string) (string, error) {
	st, err := os.Stat(c.Real)
	if err != nil {
		return "", err
	}
	resolved, err := filepath.EvalSymlinks(c.Real)
	if err != nil {
		return "", err
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%d\x00%d\x00%s\x00", cacheVersion, c.Real, resolved, st.Size(), st.ModTime().UnixNano(), wd)
	fmt.Fprintf(h, "%d\x00", len(args))
	for _, a := range args {
		fmt.Fprintf(h, "%s\x00", a)
	}
	for _, e := range clangEnv {
		v, ok := os.LookupEnv(e)
		fmt.Fprintf(h, "%s=%t:%s\x00", e, ok, v)
	}
	// The preprocessed source, as the same command with -E writes it.
	pre := exec.Command(c.Real, append(slices.Clone(args), "-E")...)
	pre.Stdout = h
	var diag bytes.Buffer
	pre.Stderr = &diag
	pre.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := pre.Run(); err != nil {
		return "", fmt.Errorf("preprocess: %w: %s", err, strings.TrimSpace(diag.String()))
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// prune removes what is left of interrupted stores, entries unused for maxAge, and
// the least recently used past limit bytes, down to 3/4 of it. Concurrent prunes may remove the same
// entry; a compile that misses an entry removed under it compiles.
func (c *clangCache) prune(now time.Time, limit int64) {
	type entry struct {
		path string
		size int64
		used time.Time
	}
	var entries []entry
	var total int64
	_ = filepath.WalkDir(c.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(p, ".stderr") {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if strings.Contains(d.Name(), ".tmp") {
			if now.Sub(info.ModTime()) > time.Hour {
				_ = os.Remove(p)
			}
			return nil
		}
		if now.Sub(info.ModTime()) > maxAge {
			removeEntry(p)
			return nil
		}
		entries = append(entries, entry{p, info.Size(), info.ModTime()})
		total += info.Size()
		return nil
	})
	if total <= limit {
		return
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].used.Before(entries[j].used) })
	for _, e := range entries {
		if total <= limit*3/4 {
			break
		}
		removeEntry(e.path)
		total -= e.size
	}
}

// removeEntry removes a cache entry: its object first, so that no object is ever
// without its diagnostics.
func removeEntry(obj string) {
	_ = os.Remove(obj)
	_ = os.Remove(obj + ".stderr")
}

func sameFile(a, b string) bool {
	sa, err := os.Stat(a)
	if err != nil {
		return false
	}
	sb, err := os.Stat(b)
	return err == nil && os.SameFile(sa, sb)
}
