// Package keyedmutex provides one mutex per key, for keys that come and go
// (view names, UID/GID mappings): a key's mutex exists only while someone
// holds or waits for it, so the set stays as small as the work in flight.
package keyedmutex

import "sync"

// Mutexes is a set of mutexes by key. The zero value is ready to use.
type Mutexes struct {
	mu    sync.Mutex
	locks map[string]*entry
}

type entry struct {
	sync.Mutex
	refs int
}

// Lock locks key's mutex and returns its unlock, which must be called once.
func (m *Mutexes) Lock(key string) (unlock func()) {
	m.mu.Lock()
	if m.locks == nil {
		m.locks = map[string]*entry{}
	}
	e, ok := m.locks[key]
	if !ok {
		e = &entry{}
		m.locks[key] = e
	}
	e.refs++
	m.mu.Unlock()
	e.Lock()
	return func() {
		e.Unlock()
		m.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(m.locks, key)
		}
		m.mu.Unlock()
	}
}

// Len returns the number of keys held or waited for.
func (m *Mutexes) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.locks)
}
