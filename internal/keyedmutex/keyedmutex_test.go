package keyedmutex

import (
	"sync"
	"testing"
	"time"
)

func TestExcludesPerKeyAndForgetsIdleKeys(t *testing.T) {
	var m Mutexes
	unlockA := m.Lock("a")
	// Another key is independent.
	unlockB := m.Lock("b")
	unlockB()

	got, done := make(chan struct{}), make(chan struct{})
	go func() {
		unlock := m.Lock("a")
		close(got)
		unlock()
		close(done)
	}()
	select {
	case <-got:
		t.Fatal("a second Lock of a held key did not wait")
	case <-time.After(50 * time.Millisecond):
	}
	unlockA()
	<-done
	if n := m.Len(); n != 0 {
		t.Errorf("%d keys remembered after every unlock, want 0", n)
	}
}

func TestCountsUnderContention(t *testing.T) {
	var (
		m  Mutexes
		wg sync.WaitGroup
	)
	var counts [2]int
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			key := []string{"x", "y"}[i%2]
			for j := 0; j < 1000; j++ {
				unlock := m.Lock(key)
				counts[i%2]++ // guarded by key's mutex only; -race checks it
				unlock()
			}
		}(i)
	}
	wg.Wait()
	if counts != [2]int{4000, 4000} {
		t.Errorf("counts %v, want 4000 each", counts)
	}
	if n := m.Len(); n != 0 {
		t.Errorf("%d keys remembered, want 0", n)
	}
}
