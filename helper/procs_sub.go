package main

import (
	"encoding/json"
	"sort"
)

// chunkOverhead is what a chunk costs beyond its bytes: counted against the buffer, so
// that a process writing a byte at a time cannot make its buffer's bookkeeping unbounded.
const chunkOverhead = 64

type chunk struct {
	off  int64
	kind byte
	data []byte
}

// ring is a process's kept output: chunks in arrival order, oldest dropped first.
type ring struct {
	chunks     []chunk
	start, end int64 // offsets of the oldest byte kept and of the next to come
	kept       int   // bytes held, chunk overheads included
	limit      int
}

func (r *ring) add(kind byte, data []byte) {
	if n := len(r.chunks); n > 0 && r.chunks[n-1].kind == kind && len(r.chunks[n-1].data)+len(data) <= chunkSize {
		r.chunks[n-1].data = append(r.chunks[n-1].data, data...)
	} else {
		r.chunks = append(r.chunks, chunk{off: r.end, kind: kind, data: append([]byte(nil), data...)})
		r.kept += chunkOverhead
	}
	r.end += int64(len(data))
	r.kept += len(data)
	for r.kept > r.limit && len(r.chunks) > 0 {
		c := &r.chunks[0]
		cut := r.kept - r.limit
		if cut < len(c.data) {
			c.data = c.data[cut:]
			c.off += int64(cut)
			r.kept -= cut
			break
		}
		r.kept -= len(c.data) + chunkOverhead
		r.chunks[0] = chunk{}
		r.chunks = r.chunks[1:]
	}
	r.start = r.end
	if len(r.chunks) > 0 {
		r.start = r.chunks[0].off
	}
}

// read copies into dst up to limit bytes from off (start <= off < end) on, all of one
// stream, and says which.
func (r *ring) read(off int64, limit int, dst []byte) (int, byte) {
	i := sort.Search(len(r.chunks), func(i int) bool {
		return r.chunks[i].off+int64(len(r.chunks[i].data)) > off
	})
	kind := r.chunks[i].kind
	n := 0
	for ; i < len(r.chunks) && n < limit && r.chunks[i].kind == kind; i++ {
		c := r.chunks[i]
		n += copy(dst[n:limit], c.data[off+int64(n)-c.off:])
	}
	return n, kind
}

// sub is one subscription to a process's output. Its frames are made by its
// connection's writer when the connection can take them, never pushed.
type sub struct {
	c  *conn
	p  *proc
	id uint32
	// Guarded by p.mu:
	next      int64 // offset of the next byte to send
	window    int64 // bytes the client can still take
	dropped   int64
	announced bool // the first 'B' went out
	done      bool
	// Guarded by c.mu:
	queued bool
}

func (c *conn) attach(id uint32, p *proc, offset, window int64) {
	s := &sub{c: c, p: p, id: id, next: offset, window: window}
	if s.next < 0 {
		s.next = 0
	}
	if s.window < 0 {
		s.window = 0
	}
	p.mu.Lock()
	p.subs[s] = struct{}{}
	p.mu.Unlock()
	c.mu.Lock()
	_, taken := c.subs[id]
	ok := !taken && !c.closed
	if ok {
		c.subs[id] = s
	}
	c.mu.Unlock()
	if !ok {
		s.end()
		if taken {
			c.answer(id, failf("other", "request id %d is in use", id))
		}
		return
	}
	c.markReady(s)
}

func (c *conn) grant(id uint32, n int64) {
	c.mu.Lock()
	s := c.subs[id]
	c.mu.Unlock()
	if s == nil || n <= 0 {
		return
	}
	s.p.mu.Lock()
	if s.window += n; s.window > 1<<62 || s.window < 0 {
		s.window = 1 << 62
	}
	wants := s.wants()
	s.p.mu.Unlock()
	if wants {
		c.markReady(s)
	}
}

func (c *conn) detach(id uint32) {
	c.mu.Lock()
	s := c.subs[id]
	delete(c.subs, id)
	c.mu.Unlock()
	if s != nil {
		s.end()
	}
	c.answer(id, nil)
}

func (s *sub) end() {
	s.p.mu.Lock()
	s.done = true
	delete(s.p.subs, s)
	s.p.mu.Unlock()
}

// wants (under p.mu) says whether frame would make a frame now. A gap is announced
// only when output would follow it: a client that takes nothing gets nothing.
func (s *sub) wants() bool {
	r := &s.p.ring
	return !s.done && (!s.announced || (s.window > 0 && s.next < r.end) ||
		(!s.p.exit.at.IsZero() && s.next >= r.end))
}

// frame makes the subscription's next frame (in buf if it is output), or nil.
func (s *sub) frame(buf []byte) []byte {
	s.p.mu.Lock()
	frame := s.nextFrame(buf)
	finished, more := s.done, s.wants()
	s.p.mu.Unlock()
	if finished {
		s.c.mu.Lock()
		if s.c.subs[s.id] == s {
			delete(s.c.subs, s.id)
		}
		s.c.mu.Unlock()
	}
	if more {
		s.c.markReady(s)
	}
	return frame
}

func (s *sub) nextFrame(buf []byte) []byte {
	r := &s.p.ring
	switch {
	case s.done:
		return nil
	case !s.announced || (s.window > 0 && s.next < r.start):
		from := s.next
		if from < r.start {
			from = r.start
		}
		gap := from - s.next
		s.next, s.dropped, s.announced = from, s.dropped+gap, true
		return jsonFrame('B', s.id, map[string]int64{"offset": from, "dropped": gap})
	case s.window > 0 && s.next < r.end:
		limit := int64(chunkSize)
		if s.window < limit {
			limit = s.window
		}
		n, kind := r.read(s.next, int(limit), buf[9:])
		s.next += int64(n)
		s.window -= int64(n)
		putHeader(buf[:9+n], kind, s.id)
		return buf[:9+n]
	case !s.p.exit.at.IsZero() && s.next >= r.end:
		s.done = true
		delete(s.p.subs, s)
		return jsonFrame('X', s.id, map[string]any{
			"code": s.p.exit.code, "signal": s.p.exit.signal, "dropped": s.dropped,
		})
	}
	return nil
}

func jsonFrame(kind byte, id uint32, v any) []byte {
	payload, _ := json.Marshal(v)
	return encodeFrame(kind, id, payload)
}
