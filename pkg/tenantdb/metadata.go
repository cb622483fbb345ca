package tenantdb

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"

	"github.com/prometheus/prometheus/model/metadata"
)

const metadataFile = "metadata.json"

// MetadataStore keeps the latest type, help and unit each metric family was
// sent with, so /api/v1/metadata can answer for data that arrived over
// remote_write (Prometheus' own handler only knows scrape targets). It is
// small (one entry per metric family) and persisted beside the tenant's TSDB.
type MetadataStore struct {
	path string

	mtx      sync.RWMutex
	families map[string]metadata.Metadata
	dirty    bool
}

func openMetadataStore(path string) (*MetadataStore, error) {
	s := &MetadataStore{path: path, families: map[string]metadata.Metadata{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, err
	}
	var stored map[string]metadata.Metadata
	if err := json.Unmarshal(b, &stored); err != nil {
		// Metadata is advisory: a damaged file must not keep the tenant's
		// samples from being served. Start empty; senders resend it.
		return s, nil
	}
	s.families = stored
	return s, nil
}

// Set records m for the metric family; it is cheap when nothing changed.
func (s *MetadataStore) Set(family string, m metadata.Metadata) { s.SetBounded(family, m, 0) }

// SetBounded records m for the metric family unless the store holds
// maxFamilies families already and this is not one of them (0: no bound);
// false: refused. A store that holds more (a bound lowered since) keeps
// them and takes no new family.
func (s *MetadataStore) SetBounded(family string, m metadata.Metadata, maxFamilies int) bool {
	s.mtx.RLock()
	old, ok := s.families[family]
	full := maxFamilies > 0 && len(s.families) >= maxFamilies
	s.mtx.RUnlock()
	if ok && old == m {
		return true
	}
	if !ok && full {
		return false
	}
	s.mtx.Lock()
	defer s.mtx.Unlock()
	if _, ok := s.families[family]; !ok && maxFamilies > 0 && len(s.families) >= maxFamilies {
		return false
	}
	s.families[family] = m
	s.dirty = true
	return true
}

// Len is the number of families with metadata.
func (s *MetadataStore) Len() int {
	s.mtx.RLock()
	defer s.mtx.RUnlock()
	return len(s.families)
}

// Get returns the metadata of one metric family.
func (s *MetadataStore) Get(family string) (metadata.Metadata, bool) {
	s.mtx.RLock()
	defer s.mtx.RUnlock()
	m, ok := s.families[family]
	return m, ok
}

// Families returns the metric family names with metadata, sorted.
func (s *MetadataStore) Families() []string {
	s.mtx.RLock()
	defer s.mtx.RUnlock()
	out := make([]string, 0, len(s.families))
	for f := range s.families {
		out = append(out, f)
	}
	sort.Strings(out)
	return out
}

// Flush persists the store if it changed since the last flush.
func (s *MetadataStore) Flush() error {
	s.mtx.Lock()
	if !s.dirty {
		s.mtx.Unlock()
		return nil
	}
	b, err := json.Marshal(s.families)
	s.dirty = false
	s.mtx.Unlock()
	if err != nil {
		return err
	}
	tmp := s.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	return os.Rename(tmp, s.path)
}
