package auth

import (
	"context"
	"errors"
	"sync"
)

// checkQueue hands out the slots of password checks (bcrypt, slow on
// purpose) to the requests waiting for one. Without it every wrong guess
// waited for a slot without bound: 400 guesses sent in 0.1 s held 400
// connections (all 256 fds of a server), a verified user's requests waited
// 10 s for a file descriptor and a user's first request 21 s for its check,
// and guesses whose clients had gone were still checked. Here
//   - the waiters are bounded, per user (maxPerUser) and in all (maxTotal):
//     past either a request is refused at once with errChecksBusy (a 503
//     that a legitimate client retries), its password unchecked;
//   - a waiter whose request ends (its client left) leaves the queue;
//   - a freed slot goes to the users waiting in turn, one check each, so a
//     user's first request waits for a check per other user waiting, not for
//     every guess queued before it. Guesses at unknown users share one turn
//     (the empty name): inventing names buys no more turns.
type checkQueue struct {
	maxPerUser, maxTotal int

	mtx     sync.Mutex
	free    int                   // slots not in use
	waiting map[string][]*checker // per user, in arrival order
	turns   []string              // users with waiters, in turn order
	next    int                   // index in turns of the next user served
	total   int                   // waiters of all users
}

// checker is a request waiting for a check slot.
type checker struct {
	ready   chan struct{} // closed when granted
	granted bool
}

// errChecksBusy refuses a request when the queue is full.
var errChecksBusy = errors.New("too many password checks waiting")

func newCheckQueue(slots, maxPerUser, maxTotal int) *checkQueue {
	return &checkQueue{maxPerUser: maxPerUser, maxTotal: maxTotal, free: slots, waiting: map[string][]*checker{}}
}

// acquire waits for a slot for a check of user's password: nil once it
// holds one (release gives it back), errChecksBusy when the queue is full,
// or ctx's error when ctx ends first.
func (q *checkQueue) acquire(ctx context.Context, user string) error {
	q.mtx.Lock()
	if q.free > 0 && q.total == 0 {
		q.free--
		q.mtx.Unlock()
		return nil
	}
	if q.total >= q.maxTotal || len(q.waiting[user]) >= q.maxPerUser {
		q.mtx.Unlock()
		return errChecksBusy
	}
	c := &checker{ready: make(chan struct{})}
	if len(q.waiting[user]) == 0 {
		q.turns = append(q.turns, user)
	}
	q.waiting[user] = append(q.waiting[user], c)
	q.total++
	q.mtx.Unlock()

	select {
	case <-c.ready:
		return nil
	case <-ctx.Done():
	}
	q.mtx.Lock()
	if c.granted { // granted as ctx ended: give the slot on
		q.mtx.Unlock()
		q.release()
		return ctx.Err()
	}
	q.remove(user, c)
	q.mtx.Unlock()
	return ctx.Err()
}

// release gives a slot back: to the next user's first waiter in turn, or
// to the free slots.
func (q *checkQueue) release() {
	q.mtx.Lock()
	defer q.mtx.Unlock()
	if len(q.turns) == 0 {
		q.free++
		return
	}
	q.next %= len(q.turns)
	user := q.turns[q.next]
	c := q.waiting[user][0]
	q.remove(user, c)
	if len(q.turns) > 0 && q.next < len(q.turns) && q.turns[q.next] == user {
		q.next++ // the user keeps its place in the turns, after the others
	}
	c.granted = true
	close(c.ready)
}

// remove takes c out of user's waiters (and user out of the turns when it
// has none left); q.mtx is held.
func (q *checkQueue) remove(user string, c *checker) {
	ws := q.waiting[user]
	for i, w := range ws {
		if w == c {
			ws = append(ws[:i], ws[i+1:]...)
			q.total--
			break
		}
	}
	if len(ws) > 0 {
		q.waiting[user] = ws
		return
	}
	delete(q.waiting, user)
	for i, u := range q.turns {
		if u == user {
			q.turns = append(q.turns[:i], q.turns[i+1:]...)
			if i < q.next {
				q.next--
			}
			break
		}
	}
}
