// Package remote is the "cloud" behind both test providers: each resource's remote object is one
// JSON file, <dir>/<id>.json. Editing the file is an out-of-band change; deleting it removes the
// object. A read can be slowed down on purpose, for performance work.
package remote

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"strconv"
	"time"
)

// Environment variables read when the provider configuration leaves the setting out.
const (
	EnvDir       = "KL_TESTPROVIDER_DIR"
	EnvReadDelay = "KL_TESTPROVIDER_READ_DELAY_MS"
)

// Store is where the remote objects live and how slow a read of one is.
type Store struct {
	Dir       string
	ReadDelay time.Duration
}

// New picks the configured values first, then the environment. An empty directory is an error:
// without it the provider would write into whatever directory Terraform happens to run in.
func New(dir string, readDelayMs *int64) (*Store, error) {
	if dir == "" {
		dir = os.Getenv(EnvDir)
	}
	if dir == "" {
		return nil, fmt.Errorf("no directory for the remote objects: set the provider's \"dir\" or %s", EnvDir)
	}
	var delay int64
	if readDelayMs != nil {
		delay = *readDelayMs
	} else if env := os.Getenv(EnvReadDelay); env != "" {
		parsed, err := strconv.ParseInt(env, 10, 64)
		if err != nil || parsed < 0 {
			return nil, fmt.Errorf("%s=%q is not a whole number of milliseconds", EnvReadDelay, env)
		}
		delay = parsed
	}
	return &Store{Dir: dir, ReadDelay: time.Duration(delay) * time.Millisecond}, nil
}

// Path escapes the id so that any id names exactly one file inside Dir.
func (s *Store) Path(id string) string {
	return filepath.Join(s.Dir, url.PathEscape(id)+".json")
}

// Load returns the object's JSON, or found=false when the file is gone. Numbers keep their digits
// (json.Number) so a value survives a round trip exactly.
func (s *Store) Load(id string) (obj map[string]any, found bool, err error) {
	if s.ReadDelay > 0 {
		time.Sleep(s.ReadDelay)
	}
	data, err := os.ReadFile(s.Path(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&obj); err != nil {
		return nil, false, fmt.Errorf("%s: %w", s.Path(id), err)
	}
	return obj, true, nil
}

// Save writes through a temporary file so a reader never sees half an object.
func (s *Store) Save(id string, obj map[string]any) error {
	data, err := json.MarshalIndent(obj, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return err
	}
	tmp := s.Path(id) + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, s.Path(id))
}

// Delete treats an object already gone as deleted.
func (s *Store) Delete(id string) error {
	err := os.Remove(s.Path(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// List returns the ids of every object in Dir, sorted; a directory not made yet holds none.
func (s *Store) List() ([]string, error) {
	entries, err := os.ReadDir(s.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || e.IsDir() {
			continue
		}
		id, err := url.PathUnescape(name)
		if err != nil {
			continue // not a file Save wrote
		}
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}

// ListingMark is the file MarkListing writes in Dir when a listing starts (not an object: List
// skips every name without the .json suffix).
const ListingMark = ".listing-started"

// MarkListing says that a listing started, for a test that interrupts one in flight.
func (s *Store) MarkListing() error {
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(s.Dir, ListingMark), nil, 0o644)
}
