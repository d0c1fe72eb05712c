// A hostile operator in Go, the sandbox probes of tests/guests/hostile for this language.
// The config's `mode` picks the misbehaviour, which starts at the first record:
//
//   - `probe`: tries the environment, files, clocks, randomness and network, emits what it saw;
//   - `allocate`: allocates without bound; `loop`: spins forever; `recurse`: recurses without
//     bound;
//   - `panic`: panics with a message; `nil`: dereferences a nil pointer.
package main

import (
	"crypto/rand"
	"net"
	"os"
	"time"

	"eddy"
)

type Probe struct {
	Env         []string `json:"env"`
	File        bool     `json:"file"`
	ClockMs     int64    `json:"clock_ms"`
	MonotonicNs int64    `json:"monotonic_ns"`
	Random      []byte   `json:"random"`
	Network     bool     `json:"network"`
}

var started = time.Now()

func probe() Probe {
	p := Probe{Env: os.Environ()}
	if p.Env == nil {
		p.Env = []string{}
	}
	_, err := os.ReadFile("/etc/passwd")
	p.File = err == nil
	p.ClockMs = time.Now().UnixMilli()
	p.MonotonicNs = int64(time.Since(started))
	p.Random = make([]byte, 8)
	_, _ = rand.Read(p.Random)
	if conn, err := net.Dial("tcp", "127.0.0.1:80"); err == nil {
		p.Network = true
		conn.Close()
	}
	return p
}

var hoard [][]byte

func recurse(depth int) int {
	var pad [64]byte
	pad[depth%64] = byte(depth)
	return recurse(depth+1) + int(pad[0])
}

type Hostile struct{ mode string }

func (h *Hostile) Open(ctx *eddy.OpenContext) error {
	var config struct {
		Mode string `json:"mode"`
	}
	if err := ctx.Config.Decode(&config); err != nil {
		return err
	}
	h.mode = config.Mode
	return nil
}

func (h *Hostile) Process(_ *eddy.Record, ctx *eddy.Context) error {
	switch h.mode {
	case "probe":
		ctx.EmitValue(probe())
	case "allocate":
		for {
			chunk := make([]byte, 1<<20)
			for i := range chunk {
				chunk[i] = 1
			}
			hoard = append(hoard, chunk)
		}
	case "loop":
		for {
		}
	case "recurse":
		recurse(0)
	case "panic":
		panic("no such thing")
	case "nil":
		var p *Probe
		return eddy.Failed("%d", p.ClockMs)
	default:
		return eddy.BadConfig("no mode %q", h.mode)
	}
	return nil
}

func init() { eddy.ExportOperator(func() eddy.Operator { return &Hostile{} }) }
