// The least any relay can add on this machine, whatever its language: one more HTTP hop each
// way through Go's net/http reverse proxy, which passes a request as it came and flushes each
// read of the answer at once. benchmarks/endpoint_overhead.py builds and runs it beside
// passthrough_proxy.py (the same hop on the endpoint's own stack, aiohttp on uvloop).
//
//	go build -o passthrough-proxy benchmarks/passthrough_proxy.go
//	passthrough-proxy PORT ROUTER_URL
package main

import (
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
)

func main() {
	if len(os.Args) != 3 {
		log.Fatal("usage: passthrough-proxy PORT ROUTER_URL")
	}
	router, err := url.Parse(os.Args[2])
	if err != nil {
		log.Fatalf("ROUTER_URL %q: %v", os.Args[2], err)
	}
	proxy := httputil.NewSingleHostReverseProxy(router)
	proxy.FlushInterval = -1 // every read of the answer goes out at once, as a stream must
	proxy.Transport = &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/chat/completions", proxy)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok"))
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:"+os.Args[1], mux))
}
