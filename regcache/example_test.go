package regcache_test

import (
	"fmt"

	"github.com/xmx-stack/xmx/regcache"
)

// The target side of a one-sided Get: the owner of the memory acquires a
// region for it and advertises (id, key, offset, length); a remote request
// naming them is checked by Lookup; a request with a wrong key or range,
// or arriving after the region went away, is refused.
func Example() {
	reg := regcache.NewRegistry() // one per endpoint
	defer reg.Close()
	cache, err := regcache.NewCache(reg, regcache.CacheConfig{})
	if err != nil {
		panic(err)
	}

	buf, err := regcache.Map(1 << 16) // unmapping it invalidates its regions
	if err != nil {
		panic(err)
	}
	copy(buf[100:], "hello")
	r, err := cache.Acquire(buf[100:105])
	if err != nil {
		panic(err)
	}
	off, _ := r.Offset(buf[100:105])
	id, key := r.ID(), r.Key() // sent to the peer

	// A request from the peer.
	data, err := reg.Lookup(id, key, off, 5)
	fmt.Printf("%q %v\n", data, err)
	_, err = reg.Lookup(id, key+1, off, 5)
	fmt.Println(err)
	_, err = reg.Lookup(id, key, off, 1<<64-1)
	fmt.Println(err)

	cache.Release(r) // stays registered, cached for the next request
	if err := regcache.Unmap(buf); err != nil {
		panic(err)
	}
	_, err = reg.Lookup(id, key, off, 5)
	fmt.Println(err)
	// Prints (not run as a test: it needs mlock):
	// "hello" <nil>
	// regcache: bad region key
	// regcache: access out of region bounds
	// regcache: no such region
}
