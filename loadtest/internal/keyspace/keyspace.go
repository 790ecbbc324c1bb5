// Package keyspace chooses the API key and the endpoint of each load-test
// request: Keys distinct keys named Prefix+index, drawn uniformly or from a
// Zipf distribution (math/rand/v2), and endpoints drawn uniformly from a
// list.
//
// Under Zipf the key with index 0 is the most frequent, index 1 the next and
// so on: P(i) ∝ (1+i)^-s. A [Picker] is deterministic for a given seed, so a
// run can be replayed.
package keyspace

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
)

// Distributions a [Config] accepts.
const (
	// Uniform draws every key with the same probability.
	Uniform = "uniform"
	// Zipf draws key i with probability proportional to (1+i)^-s.
	Zipf = "zipf"
)

// DefaultZipfS is the Zipf exponent loadtest uses unless told otherwise.
const DefaultZipfS = 1.1

// Config describes the keys and endpoints of a run.
type Config struct {
	// Keys is the number of distinct keys, at least 1.
	Keys int
	// Prefix starts every key; the key index follows in decimal.
	Prefix string
	// Dist is Uniform or Zipf; empty means Uniform.
	Dist string
	// ZipfS is the Zipf exponent, greater than 1 (math/rand/v2 requires it).
	// Only read when Dist is Zipf.
	ZipfS float64
	// Paths are the endpoints, drawn uniformly; at least one.
	Paths []string
}

// Validate reports every problem with c at once, joined.
func (c Config) Validate() error {
	var errs []error
	if c.Keys < 1 {
		errs = append(errs, fmt.Errorf("keyspace: keys must be at least 1, got %d", c.Keys))
	}
	switch c.Dist {
	case "", Uniform:
	case Zipf:
		if !(c.ZipfS > 1) {
			errs = append(errs, fmt.Errorf("keyspace: zipf exponent must be greater than 1, got %v", c.ZipfS))
		}
	default:
		errs = append(errs, fmt.Errorf("keyspace: distribution %q: want %q or %q", c.Dist, Uniform, Zipf))
	}
	if len(c.Paths) == 0 {
		errs = append(errs, errors.New("keyspace: at least one path is required"))
	}
	return errors.Join(errs...)
}

// Picker draws keys and paths. It is not safe for concurrent use: give each
// goroutine its own, from [New] with distinct seeds.
type Picker struct {
	keys   int
	prefix string
	paths  []string
	rng    *rand.Rand
	zipf   *rand.Zipf // nil: uniform
	buf    []byte
}

// New returns a Picker for cfg whose draws are fixed by seed. It returns
// cfg.Validate's error if cfg is not valid.
func New(cfg Config, seed uint64) (*Picker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	p := &Picker{keys: cfg.Keys, prefix: cfg.Prefix, paths: cfg.Paths, rng: rng}
	if cfg.Dist == Zipf {
		p.zipf = rand.NewZipf(rng, cfg.ZipfS, 1, uint64(cfg.Keys-1))
	}
	return p, nil
}

// Index draws a key index in [0, Keys).
func (p *Picker) Index() int {
	if p.zipf != nil {
		return int(p.zipf.Uint64())
	}
	return p.rng.IntN(p.keys)
}

// Key returns the name of the key with index i: Prefix followed by i.
func (p *Picker) Key(i int) string {
	p.buf = strconv.AppendInt(append(p.buf[:0], p.prefix...), int64(i), 10)
	return string(p.buf)
}

// Path draws an endpoint.
func (p *Picker) Path() string {
	if len(p.paths) == 1 {
		return p.paths[0]
	}
	return p.paths[p.rng.IntN(len(p.paths))]
}

// Next draws a key and an endpoint.
func (p *Picker) Next() (key, path string) {
	return p.Key(p.Index()), p.Path()
}
